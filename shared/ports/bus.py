"""Ports of the bus: what services need from NATS, as narrow Protocols.

In-memory fakes with the same semantics (revisioned compare-and-set, de-duplicated message ids)
are in tests/fakes/ for the unit tier."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from pydantic import BaseModel

from shared.domain.record import SandboxRecord
from shared.models.messages import address
from shared.models.snapshot_records import SnapshotRecord


class Publisher(Protocol):
    async def publish(self, message: BaseModel, subject: str, *, msg_id: str) -> bool:
        """Publish durably; ``True`` if stored, ``False`` if deduplicated."""
        ...


async def emit(
    publisher: Publisher, message: BaseModel, *id_extra: str, generation: int | None = None
) -> bool:
    """Publish a command or event to the subject, and with the message id, derived from it
    (``shared.models.messages.address``): the one way torpor's services publish."""
    subject, mid = address(message, *id_extra, generation=generation)
    return await publisher.publish(message, subject, msg_id=mid)


Mutation = Callable[[SandboxRecord], SandboxRecord]


class SandboxStore(Protocol):
    """The KV bucket of sandbox records. Writes are compare-and-set on the revision only."""

    async def get(self, sandbox_id: str) -> SandboxRecord | None: ...

    async def get_with_revision(self, sandbox_id: str) -> tuple[SandboxRecord, int] | None: ...

    async def create(self, record: SandboxRecord) -> SandboxRecord:
        """Insert a new record; ``Conflict`` if the id is taken."""
        ...

    async def update(self, sandbox_id: str, mutate: Mutation) -> SandboxRecord:
        """Read, ``mutate`` (may raise ``IllegalTransition``), CAS write; retries lost races."""
        ...

    async def delete(self, sandbox_id: str) -> None: ...

    async def list(self) -> list[SandboxRecord]: ...

    async def wait_for(
        self, sandbox_id: str, predicate: Callable[[SandboxRecord], bool], *, timeout: float
    ) -> SandboxRecord:
        """Block until the record satisfies ``predicate`` (watch-based); ``TimeoutError`` if not."""
        ...


SnapshotMutation = Callable[[SnapshotRecord], SnapshotRecord]


class SnapshotStore(Protocol):
    """The KV bucket of stored snapshots (``torpor_snapshots``); compare-and-set writes only."""

    async def get(self, snapshot_id: str) -> SnapshotRecord | None: ...

    async def create(self, record: SnapshotRecord) -> SnapshotRecord:
        """Insert; ``Conflict`` if the id is taken."""
        ...

    async def update(self, snapshot_id: str, mutate: SnapshotMutation) -> SnapshotRecord:
        """Read, ``mutate`` (may raise), CAS write; ``NotFound`` when absent."""
        ...

    async def delete(self, snapshot_id: str) -> None: ...

    async def list(self) -> list[SnapshotRecord]: ...

    async def wait_for(
        self, snapshot_id: str, predicate: Callable[[SnapshotRecord], bool], *, timeout: float
    ) -> SnapshotRecord:
        """Block until the record satisfies ``predicate``; ``NotFound`` if it is deleted."""
        ...
