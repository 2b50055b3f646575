"""``SandboxStore`` over the NATS KV bucket ``sandboxes``: compare-and-set on the revision only."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime

from nats.js.client import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from shared.bus.kv import key_names, read_record
from shared.domain.record import SandboxRecord
from shared.errors import Conflict, NotFound
from shared.ports.bus import Mutation

_CAS_ATTEMPTS = 16


class KvSandboxStore:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def get_with_revision(self, sandbox_id: str) -> tuple[SandboxRecord, int] | None:
        return await read_record(self._kv, sandbox_id, SandboxRecord)

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        found = await self.get_with_revision(sandbox_id)
        return found[0] if found else None

    async def create(self, record: SandboxRecord) -> SandboxRecord:
        try:
            await self._kv.create(record.sandbox_id, record.model_dump_json().encode())
        except KeyWrongLastSequenceError as e:
            msg = f"sandbox {record.sandbox_id} already exists"
            raise Conflict(msg) from e
        return record

    async def update(self, sandbox_id: str, mutate: Mutation) -> SandboxRecord:
        for _ in range(_CAS_ATTEMPTS):
            found = await self.get_with_revision(sandbox_id)
            if found is None:
                msg = f"sandbox {sandbox_id} not found"
                raise NotFound(msg)
            record, revision = found
            new = mutate(record).model_copy(update={"updated_at": datetime.now(UTC)})
            try:
                await self._kv.update(sandbox_id, new.model_dump_json().encode(), last=revision)
            except KeyWrongLastSequenceError:
                await asyncio.sleep(0)  # lost the race: re-read and re-validate
                continue
            return new
        msg = f"sandbox {sandbox_id}: too much contention on its record"
        raise Conflict(msg)

    async def delete(self, sandbox_id: str) -> None:
        with contextlib.suppress(KeyNotFoundError):
            await self._kv.delete(sandbox_id)

    async def list(self) -> list[SandboxRecord]:
        out: list[SandboxRecord] = []
        for key in await key_names(self._kv):
            if (record := await self.get(key)) is not None:
                out.append(record)
        return out

    async def wait_for(
        self, sandbox_id: str, predicate: Callable[[SandboxRecord], bool], *, timeout: float
    ) -> SandboxRecord:
        watcher = await self._kv.watch(sandbox_id)
        try:
            async with asyncio.timeout(timeout):
                async for entry in watcher:
                    if entry is None or entry.value is None or entry.operation in ("DEL", "PURGE"):
                        if entry is not None and entry.operation in ("DEL", "PURGE"):
                            msg = f"sandbox {sandbox_id} was deleted"
                            raise NotFound(msg)
                        continue
                    record = SandboxRecord.model_validate_json(entry.value)
                    if predicate(record):
                        return record
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]
        raise TimeoutError(sandbox_id)  # pragma: no cover - the watch only ends by timeout


async def bucket_version(js: JetStreamContext, bucket: str) -> int:
    """The sequence of the bucket's last write (one request): unchanged means no key changed."""
    info = await js.stream_info(f"KV_{bucket}")
    return int(info.state.last_seq)
