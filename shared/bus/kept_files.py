"""``KeptFiles`` over the NATS JetStream object store ``torpor_kept_files``.

Bounded twice: the bucket's ``max_bytes`` (``TORPOR_KEPT_FILES_MAX_BYTES``, set by whoever
provisions the bus; a full bucket refuses new chunks: ``discard: new``) and each put's ``limit``
(the template's disk size), checked before anything is sent. A put writes its chunks under a
fresh subject and then the object's meta (a rollup), so a failed put leaves the previous
object as it was. Object names come only from ``KeptKey`` (validated ids).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import IO, Any

import nats
import structlog
from nats.aio.client import Client
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from shared.bus.topology import OBJ_KEPT_FILES
from shared.errors import SnapshotTooLarge, Unavailable
from shared.ports.kept_files import KeptKey

log = structlog.get_logger()

Opener = Callable[[], Awaitable[JetStreamContext]]


class NatsKeptFiles:
    """Over a JetStream context, or an opener called on first use (a runtime is built before
    it may await anything)."""

    def __init__(self, js: JetStreamContext | Opener, *, bucket: str = OBJ_KEPT_FILES) -> None:
        self._js: JetStreamContext | None = js if isinstance(js, JetStreamContext) else None
        self._open: Opener | None = None if isinstance(js, JetStreamContext) else js
        self._bucket = bucket
        self._store: ObjectStore | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def connecting(
        cls, url: str, options: Mapping[str, Any] | None = None, *, bucket: str = OBJ_KEPT_FILES
    ) -> NatsKeptFiles:
        """One connection of its own, opened on first use (``close`` ends it)."""
        holder: dict[str, Client] = {}

        async def open_js() -> JetStreamContext:
            nc = await nats.connect(url, **dict(options or {}))
            holder["nc"] = nc
            return nc.jetstream()

        store = cls(open_js, bucket=bucket)
        store._holder = holder
        return store

    _holder: dict[str, Client] | None = None

    async def _bucket_store(self) -> ObjectStore:
        async with self._lock:
            if self._store is None:
                if self._js is None:
                    assert self._open is not None
                    self._js = await self._open()
                try:
                    self._store = await self._js.object_store(self._bucket)
                except Exception as e:
                    msg = f"kept-files store {self._bucket!r} is not reachable: {e}"
                    raise Unavailable(msg) from e
            return self._store

    async def put(self, key: KeptKey, source: IO[bytes], *, limit: int) -> int:
        start = source.tell()
        size = os.fstat(source.fileno()).st_size - start
        if size > limit:
            msg = f"kept files of {key.name} are {size} bytes, over the limit of {limit}"
            raise SnapshotTooLarge(msg)
        store = await self._bucket_store()
        try:
            info = await store.put(key.name, source)  # type: ignore[arg-type]
        except Exception as e:
            # No secret in the message: nats errors name subjects and limits only.
            msg = f"kept-files store refused {key.name}: {type(e).__name__}: {e}"[:500]
            raise Unavailable(msg) from e
        log.info("kept_files_stored", key=key.name, bytes=info.size)
        return int(info.size or 0)

    async def get(self, key: KeptKey, into: IO[bytes]) -> bool:
        store = await self._bucket_store()
        try:
            await store.get(key.name, writeinto=into)  # type: ignore[arg-type]
        except (ObjectNotFoundError, NotFoundError):
            return False
        except Exception as e:
            msg = f"kept-files store could not read {key.name}: {type(e).__name__}: {e}"[:500]
            raise Unavailable(msg) from e
        return True

    async def delete(self, key: KeptKey) -> None:
        store = await self._bucket_store()
        with contextlib.suppress(ObjectNotFoundError, NotFoundError):
            await store.delete(key.name)

    async def close(self) -> None:
        nc = (self._holder or {}).get("nc")
        if nc is not None and not nc.is_closed:
            await nc.close()
