"""``UsageStore`` over the NATS KV bucket ``torpor_usage``: ``<owner token>.<sandbox id>`` keys,
compare-and-set writes."""

from __future__ import annotations

import asyncio
import contextlib

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from pydantic import ValidationError

from shared.bus.kv import LazyBucket, key_names, opened, read_record
from shared.errors import Conflict
from shared.models.usage import SandboxUsage
from shared.models.webhooks import owner_token


def usage_key(owner: str, sandbox_id: str) -> str:
    return f"{owner_token(owner)}.{sandbox_id}"


class KvUsageStore:
    def __init__(self, kv: KeyValue | LazyBucket) -> None:
        self._bucket = kv

    async def get_with_revision(
        self, owner: str, sandbox_id: str
    ) -> tuple[SandboxUsage, int] | None:
        kv = await opened(self._bucket)
        return await read_record(kv, usage_key(owner, sandbox_id), SandboxUsage)

    async def write(self, usage: SandboxUsage, *, revision: int | None) -> None:
        kv = await opened(self._bucket)
        key, value = usage_key(usage.owner, usage.sandbox_id), usage.model_dump_json().encode()
        try:
            if revision is None:
                await kv.create(key, value)
            else:
                await kv.update(key, value, last=revision)
        except KeyWrongLastSequenceError as e:
            msg = f"usage of {usage.sandbox_id} changed"
            raise Conflict(msg) from e

    async def _under(self, prefix: str) -> list[SandboxUsage]:
        kv = await opened(self._bucket)
        keys = await key_names(kv, under=prefix)

        async def one(key: str) -> SandboxUsage | None:
            with contextlib.suppress(KeyNotFoundError, ValidationError):
                entry = await kv.get(key)
                if entry.value and entry.operation not in ("DEL", "PURGE"):
                    return SandboxUsage.model_validate_json(entry.value)
            return None

        found = await asyncio.gather(*(one(k) for k in keys))
        return [u for u in found if u is not None]

    async def of_owner(self, owner: str) -> list[SandboxUsage]:
        return [u for u in await self._under(f"{owner_token(owner)}.") if u.owner == owner]

    async def everyone(self) -> list[SandboxUsage]:
        return await self._under("")
