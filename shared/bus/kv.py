"""``Bucket`` (shared.auth.ports) over a NATS KV bucket: bytes in, bytes out, our errors out."""

from __future__ import annotations

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError
from nats.js.kv import KeyValue

from shared.errors import Conflict


class NatsBucket:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def get(self, key: str) -> bytes | None:
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError:  # also KeyDeletedError
            return None
        if entry.operation in ("DEL", "PURGE"):
            return None
        return entry.value

    async def put(self, key: str, value: bytes) -> None:
        await self._kv.put(key, value)

    async def create(self, key: str, value: bytes) -> None:
        try:
            await self._kv.create(key, value)
        except KeyWrongLastSequenceError as e:
            msg = f"key {key} already exists"
            raise Conflict(msg) from e

    async def keys(self) -> list[str]:
        try:
            return list(await self._kv.keys())
        except NoKeysError:
            return []
