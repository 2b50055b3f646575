"""The kept-files store port: where a runtime whose pods lose their disk keeps a sandbox's
writable files (a tar of ``/home/user`` and ``/workspace``) between a pause and the next pod.

Objects are named only by a ``KeptKey``, made from a validated sandbox id or snapshot id (never
from a request string), so no sandbox can name another's. The adapter is
``shared.bus.kept_files.NatsKeptFiles`` (a NATS JetStream object store, bounded by the bucket's
``max_bytes`` and each put's ``limit``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, Literal, Protocol

from shared.ids import is_valid_sandbox_id
from shared.models.snapshot_records import is_snapshot_id

Kind = Literal["sandbox", "snapshot"]


@dataclass(frozen=True)
class KeptKey:
    """One object's name: ``sandbox.<id>`` (files kept across a pause) or ``snapshot.<id>``
    (files of a stored snapshot). ``ValueError`` for an id that is not one."""

    kind: Kind
    ident: str

    def __post_init__(self) -> None:
        valid = is_valid_sandbox_id if self.kind == "sandbox" else is_snapshot_id
        if self.kind not in ("sandbox", "snapshot") or not valid(self.ident):
            msg = f"invalid {self.kind} id {self.ident[:80]!r}"
            raise ValueError(msg)

    @classmethod
    def sandbox(cls, sandbox_id: str) -> KeptKey:
        return cls("sandbox", sandbox_id)

    @classmethod
    def snapshot(cls, snapshot_id: str) -> KeptKey:
        return cls("snapshot", snapshot_id)

    @property
    def name(self) -> str:
        return f"{self.kind}.{self.ident}"


class KeptFiles(Protocol):
    async def put(self, key: KeptKey, source: IO[bytes], *, limit: int) -> int:
        """Store ``source`` (read from its current position to its end) as ``key``, replacing
        what was there only once all of it is stored; the bytes stored. ``SnapshotTooLarge``
        over ``limit`` bytes (nothing stored); ``Unavailable`` when the store cannot take it
        (down, bucket full)."""
        ...

    async def get(self, key: KeptKey, into: IO[bytes]) -> bool:
        """Write the object into ``into``; False when there is none."""
        ...

    async def delete(self, key: KeptKey) -> None:
        """Remove the object (idempotent)."""
        ...

    async def close(self) -> None:
        """Release the connection (if the adapter opened one)."""
        ...
