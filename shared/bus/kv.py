"""``Bucket`` (shared.auth.ports) over a NATS KV bucket: bytes in, bytes out, our errors out."""

from __future__ import annotations

import contextlib
from typing import TypeVar

from nats.js.client import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from pydantic import BaseModel

from shared.errors import Conflict

M = TypeVar("M", bound=BaseModel)


async def read_entry(kv: KeyValue, key: str) -> tuple[bytes, int] | None:
    """The key's value and revision; None when it has none (never written, deleted, purged)."""
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:  # also KeyDeletedError
        return None
    if entry.value is None or entry.operation in ("DEL", "PURGE"):
        return None
    return entry.value, int(entry.revision or 0)


async def read_value(kv: KeyValue, key: str) -> bytes | None:
    found = await read_entry(kv, key)
    return found[0] if found else None


async def read_record(kv: KeyValue, key: str, model: type[M]) -> tuple[M, int] | None:
    """The key's record (JSON of ``model``) and its revision."""
    found = await read_entry(kv, key)
    return (model.model_validate_json(found[0]), found[1]) if found else None


class NatsBucket:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def get(self, key: str) -> bytes | None:
        return await read_value(self._kv, key)

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
        return await read_entry(self._kv, key)

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
