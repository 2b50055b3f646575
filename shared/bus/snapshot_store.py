"""``SnapshotStore`` over the NATS KV bucket ``torpor_snapshots``: compare-and-set writes only."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from shared.bus.kv import key_names, read_record
from shared.errors import Conflict, NotFound
from shared.models.snapshot_records import SnapshotRecord, is_snapshot_id
from shared.ports.bus import SnapshotMutation

_CAS_ATTEMPTS = 16


class KvSnapshotStore:
    """Over an open bucket, or an opener called on first use (a worker builds its router before
    it may await anything)."""

    def __init__(self, kv: KeyValue | Callable[[], Awaitable[KeyValue]]) -> None:
        self._kv_: KeyValue | None = kv if isinstance(kv, KeyValue) else None
        self._open = None if isinstance(kv, KeyValue) else kv

    @property
    def _kv(self) -> KeyValue:
        assert self._kv_ is not None
        return self._kv_

    async def _ready(self) -> None:
        if self._kv_ is None and self._open is not None:
            self._kv_ = await self._open()

    async def _entry(self, snapshot_id: str) -> tuple[SnapshotRecord, int] | None:
        if not is_snapshot_id(snapshot_id):  # never a hostile string as a KV key
            return None
        await self._ready()
        return await read_record(self._kv, snapshot_id, SnapshotRecord)

    async def get(self, snapshot_id: str) -> SnapshotRecord | None:
        found = await self._entry(snapshot_id)
        return found[0] if found else None

    async def create(self, record: SnapshotRecord) -> SnapshotRecord:
        await self._ready()
        try:
            await self._kv.create(record.snapshot_id, record.model_dump_json().encode())
        except KeyWrongLastSequenceError as e:
            raise Conflict(f"snapshot {record.snapshot_id} already exists") from e
        return record

    async def update(self, snapshot_id: str, mutate: SnapshotMutation) -> SnapshotRecord:
        for _ in range(_CAS_ATTEMPTS):
            found = await self._entry(snapshot_id)
            if found is None:
                raise NotFound(f"snapshot {snapshot_id} not found")
            record, revision = found
            new = mutate(record)
            if new is record:
                return record  # nothing to write (a redelivery found its work done)
            new = new.model_copy(update={"updated_at": datetime.now(UTC)})
            try:
                await self._kv.update(snapshot_id, new.model_dump_json().encode(), last=revision)
            except KeyWrongLastSequenceError:
                await asyncio.sleep(0)
                continue
            return new
        raise Conflict(f"snapshot {snapshot_id}: too much contention on its record")

    async def delete(self, snapshot_id: str) -> None:
        await self._ready()
        with contextlib.suppress(KeyNotFoundError):
            await self._kv.delete(snapshot_id)

    async def list(self) -> list[SnapshotRecord]:
        await self._ready()
        out: list[SnapshotRecord] = []
        for key in await key_names(self._kv):
            if (record := await self.get(key)) is not None:
                out.append(record)
        return out

    async def wait_for(
        self, snapshot_id: str, predicate: Callable[[SnapshotRecord], bool], *, timeout: float
    ) -> SnapshotRecord:
        await self._ready()
        watcher = await self._kv.watch(snapshot_id)
        try:
            async with asyncio.timeout(timeout):
                async for entry in watcher:
                    if entry is None:
                        continue
                    if entry.operation in ("DEL", "PURGE"):
                        raise NotFound(f"snapshot {snapshot_id} was deleted")
                    if entry.value is None:
                        continue
                    record = SnapshotRecord.model_validate_json(entry.value)
                    if predicate(record):
                        return record
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]
        raise TimeoutError(snapshot_id)  # pragma: no cover - the watch only ends by timeout
