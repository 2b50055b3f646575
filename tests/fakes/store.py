"""``SandboxStore`` in memory, with the KV bucket's write rules.

Like NATS KV: every write gets the next revision of the bucket (one sequence for all keys);
``create`` fails with ``Conflict`` if the key holds a record; ``compare_and_set`` fails with
``Conflict`` when the revision moved; ``update`` is read → mutate → compare-and-set, retried on a
lost race exactly like ``shared.bus.records.KvSandboxStore``. ``race`` lets a test write between
the read and the compare-and-set of the next update, to exercise that path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime

from shared.domain.record import SandboxRecord
from shared.errors import Conflict, NotFound
from shared.ports.bus import Mutation

_CAS_ATTEMPTS = 16

Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class InMemorySandboxStore:
    def __init__(self, *, clock: Clock = _utcnow) -> None:
        self._clock = clock
        self._entries: dict[str, tuple[SandboxRecord, int]] = {}
        self._revision = 0
        self._changed = asyncio.Condition()
        self.writes: list[SandboxRecord] = []  # every stored version, in order
        self.lost_races = 0
        # Called once between the read and the compare-and-set of the next ``update``.
        self.race: Callable[[], None] | None = None

    # ---- the KV rules -------------------------------------------------------------------------

    def revision(self, sandbox_id: str) -> int | None:
        found = self._entries.get(sandbox_id)
        return found[1] if found else None

    def compare_and_set(self, record: SandboxRecord, *, last: int) -> int:
        """Store ``record`` if its key is still at revision ``last``; the new revision."""
        current = self.revision(record.sandbox_id)
        if current != last:
            msg = f"sandbox {record.sandbox_id}: revision {last} is stale (now {current})"
            raise Conflict(msg)
        return self._store(record)

    def put(self, record: SandboxRecord) -> int:
        """Unconditional write (a test setting the scene, or another writer racing)."""
        return self._store(record)

    def _store(self, record: SandboxRecord) -> int:
        self._revision += 1
        self._entries[record.sandbox_id] = (record, self._revision)
        self.writes.append(record)
        self._notify()
        return self._revision

    def _notify(self) -> None:
        async def wake() -> None:
            async with self._changed:
                self._changed.notify_all()

        try:
            asyncio.get_running_loop().create_task(wake())
        except RuntimeError:  # no loop: nobody can be waiting
            pass

    # ---- SandboxStore -------------------------------------------------------------------------

    async def get_with_revision(self, sandbox_id: str) -> tuple[SandboxRecord, int] | None:
        await asyncio.sleep(0)  # a real read yields; so does this one
        return self._entries.get(sandbox_id)

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        found = await self.get_with_revision(sandbox_id)
        return found[0] if found else None

    async def create(self, record: SandboxRecord) -> SandboxRecord:
        if record.sandbox_id in self._entries:
            msg = f"sandbox {record.sandbox_id} already exists"
            raise Conflict(msg)
        self._store(record)
        return record

    async def update(self, sandbox_id: str, mutate: Mutation) -> SandboxRecord:
        for _ in range(_CAS_ATTEMPTS):
            found = await self.get_with_revision(sandbox_id)
            if found is None:
                msg = f"sandbox {sandbox_id} not found"
                raise NotFound(msg)
            record, revision = found
            new = mutate(record).model_copy(update={"updated_at": self._clock()})
            if self.race is not None:
                race, self.race = self.race, None
                race()
            try:
                self.compare_and_set(new, last=revision)
            except Conflict:
                self.lost_races += 1
                continue
            return new
        msg = f"sandbox {sandbox_id}: too much contention on its record"
        raise Conflict(msg)

    async def delete(self, sandbox_id: str) -> None:
        self._entries.pop(sandbox_id, None)
        self._revision += 1
        self._notify()

    async def list(self) -> list[SandboxRecord]:
        return [record for record, _ in self._entries.values()]

    async def wait_for(
        self, sandbox_id: str, predicate: Callable[[SandboxRecord], bool], *, timeout: float
    ) -> SandboxRecord:
        async with asyncio.timeout(timeout), self._changed:
            while True:
                found = self._entries.get(sandbox_id)
                if found is None:
                    if any(r.sandbox_id == sandbox_id for r in self.writes):
                        msg = f"sandbox {sandbox_id} was deleted"
                        raise NotFound(msg)
                elif predicate(found[0]):
                    return found[0]
                await self._changed.wait()
