"""Sandbox records for the proxy's hot path (``services.proxy.app.RecordSource``): a cache fed
by a KV watch on the ``sandboxes`` bucket, so a proxied request does not cost a KV read. Until
the watch has delivered its initial snapshot (and whenever it is down) lookups go to KV
directly."""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog
from nats.js.kv import KeyValue

from shared.bus.kv import read_record
from shared.domain.record import SandboxRecord

log = structlog.get_logger()

_NEGATIVE_TTL = 1.0  # seconds an unknown id is remembered (bounds KV reads for garbage ids)


class KvRecordCache:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        self._records: dict[str, SandboxRecord] = {}
        self._missing: dict[str, float] = {}
        self._ready = False
        self._task: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        return self._ready

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="proxy-record-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        if self._ready:
            return self._records.get(sandbox_id)
        if self._missing.get(sandbox_id, 0.0) > time.monotonic():
            return None
        record = await self._read(sandbox_id)
        if record is None:
            self._missing[sandbox_id] = time.monotonic() + _NEGATIVE_TTL
        else:
            self.remember(record)
        return record

    def peek(self, sandbox_id: str) -> SandboxRecord | None:
        return self._records.get(sandbox_id) if self._ready else None

    def remember(self, record: SandboxRecord) -> None:
        current = self._records.get(record.sandbox_id)
        if current is None or (record.generation, record.updated_at) >= (
            current.generation,
            current.updated_at,
        ):
            self._records[record.sandbox_id] = record
            self._missing.pop(record.sandbox_id, None)

    async def _read(self, sandbox_id: str) -> SandboxRecord | None:
        found = await read_record(self._kv, sandbox_id, SandboxRecord)
        return found[0] if found else None

    async def _run(self) -> None:
        while True:
            try:
                await self._watch()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("record_watch_failed", error=repr(e))
            self._ready = False
            await asyncio.sleep(1.0)

    async def _watch(self) -> None:
        watcher = await self._kv.watchall()
        try:
            fresh: dict[str, SandboxRecord] = {}
            async for entry in watcher:
                if entry is None:  # the initial values have all been delivered
                    self._records = fresh
                    self._ready = True
                    log.info("record_watch_ready", sandboxes=len(self._records))
                    continue
                target = self._records if self._ready else fresh
                if entry.value is None or entry.operation in ("DEL", "PURGE"):
                    target.pop(entry.key, None)
                    continue
                try:
                    target[entry.key] = SandboxRecord.model_validate_json(entry.value)
                except ValueError:
                    log.warning("record_unreadable", sandbox_id=entry.key)
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]
