"""``Bucket`` (shared.auth.ports) over a NATS KV bucket: bytes in, bytes out, our errors out."""

from __future__ import annotations

import contextlib

from nats.js.client import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
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
        return await key_names(self._kv)

    async def delete(self, key: str) -> None:
        with contextlib.suppress(KeyNotFoundError):
            await self._kv.delete(key)


class NatsCasBucket:
    """``shared.quota.ports.CasBucket`` over a NATS KV bucket."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def entry(self, key: str) -> tuple[bytes, int] | None:
        try:
            found = await self._kv.get(key)
        except KeyNotFoundError:
            return None
        if found.operation in ("DEL", "PURGE") or found.value is None:
            return None
        return found.value, int(found.revision or 0)

    async def create(self, key: str, value: bytes) -> None:
        try:
            await self._kv.create(key, value)
        except KeyWrongLastSequenceError as e:
            raise Conflict(f"key {key} already exists") from e

    async def update(self, key: str, value: bytes, *, last: int) -> None:
        try:
            await self._kv.update(key, value, last=last)
        except KeyWrongLastSequenceError as e:
            raise Conflict(f"key {key} changed") from e


async def key_names(kv: KeyValue, *, under: str = "") -> list[str]:
    """Every key with a message in the bucket (deleted ones included: their ``get`` is ``None``).

    One ``stream_info`` with a subjects filter, instead of ``KeyValue.keys()``: that one's watcher
    can report "no more keys" before it has processed keys already delivered to it (seen as an
    empty list under load). ``under``: only the keys below this prefix (``"alice."``)."""
    pre = kv._pre
    info = await kv._js.stream_info(kv._stream, subjects_filter=f"{pre}{under}>")
    return [subject[len(pre) :] for subject in (info.state.subjects or {})]


class LazyBucket:
    """A KV bucket opened on first use: for adapters built in a worker's synchronous ``build``
    (``shared.lifecycle.hosting``), where the bus is connected but nothing can be awaited."""

    def __init__(self, js: JetStreamContext, bucket: str) -> None:
        self._js = js
        self._bucket = bucket
        self._kv: KeyValue | None = None

    async def __call__(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self._js.key_value(self._bucket)
        return self._kv


async def opened(kv: KeyValue | LazyBucket) -> KeyValue:
    return await kv() if isinstance(kv, LazyBucket) else kv
