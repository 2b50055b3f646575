"""``SnapshotService``: stored snapshots for the api (E2B ``create_snapshot``, ``list_snapshots``,
``delete_snapshot``, create from a snapshot id, fork).

Like ``SandboxLifecycle`` it never touches a runtime or a daemon: it writes the snapshot record
(KV create), publishes the command, and waits on the record. A snapshot is its owner's alone:
another user's snapshot id is ``NotFound`` everywhere (admins, ``owner=None``, see all).

Decisions written down here:
- The count quota is checked after the record is inserted (each taker counts the snapshots
  inserted before its own, so concurrent takes never exceed it together), like sandboxes.
- A take that failed is answered with the status the snapshotter recorded (501 where the runtime
  cannot keep files, 404 when the sandbox went away) and its record is deleted through the bus.
- Delete hides the snapshot at once (``deleting``, by CAS), then the snapshotter removes the files
  and the record. Sandboxes started from it keep their own copies.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from shared.bus import subjects
from shared.domain import states
from shared.domain.record import SnapshotRef
from shared.errors import (
    Conflict,
    NotFound,
    QuotaExceeded,
    RuntimeFailure,
    TorporError,
    Unsupported,
)
from shared.ids import is_valid_sandbox_id
from shared.models.messages import DeleteSnapshot, TakeSnapshot
from shared.models.snapshot_records import (
    SnapshotRecord,
    SnapshotState,
    is_snapshot_id,
    new_snapshot_id,
)
from shared.models.snapshots import Snapshot
from shared.ports.bus import Publisher, SandboxStore, SnapshotStore

QUOTA_RETRY_AFTER = 30
_LIVE = frozenset({SnapshotState.TAKING, SnapshotState.READY})


def _now() -> datetime:
    return datetime.now(UTC)


def origin_of(snap: SnapshotRecord) -> SnapshotRef:
    """What a sandbox started from ``snap`` replays (its record's ``origin``)."""
    if snap.annotation is None:
        raise NotFound(f"snapshot {snap.snapshot_id} not found")
    decoded = Snapshot.decode(snap.annotation)
    return SnapshotRef(
        id=decoded.id,
        captured_at=decoded.captured_time,
        process_count=len(decoded.processes),
        annotation=snap.annotation,
    )


class SnapshotService:
    def __init__(
        self,
        sandboxes: SandboxStore,
        snapshots: SnapshotStore,
        publisher: Publisher,
        *,
        retention: timedelta = timedelta(days=30),
        max_snapshots: Callable[[str], Awaitable[int]] | None = None,
    ) -> None:
        self._sandboxes = sandboxes
        self._snapshots = snapshots
        self._publisher = publisher
        self._retention = retention
        self._max_snapshots = max_snapshots  # per user; 0 means unlimited

    # ---- take -------------------------------------------------------------------------

    async def take(
        self,
        sandbox_id: str,
        *,
        owner: str | None,
        name: str | None = None,
        internal: bool = False,
        files_only: bool = False,
        wait: float = 55.0,
    ) -> SnapshotRecord:
        sandbox = await self._sandboxes.get(sandbox_id) if is_valid_sandbox_id(sandbox_id) else None
        if (
            sandbox is None
            or states.is_gone(sandbox.state)
            or (owner is not None and sandbox.owner != owner)
        ):
            raise NotFound(f"sandbox {sandbox_id} not found")
        at = _now()
        record = SnapshotRecord(
            snapshot_id=new_snapshot_id(),
            owner=sandbox.owner,
            source_sandbox_id=sandbox_id,
            name=name,
            template=sandbox.template,
            envs=dict(sandbox.envs),
            network=sandbox.network,
            hooks=sandbox.hooks,
            internal=internal,
            files_only=files_only,
            created_at=at,
            retain_until=at + self._retention,
            updated_at=at,
        )
        record = await self._snapshots.create(record)
        try:
            await self._admit(record)
            await self._publisher.publish(
                TakeSnapshot(sandbox_id=sandbox_id, snapshot_id=record.snapshot_id),
                subjects.of(subjects.CMD_SNAPSHOT, sandbox_id),
                msg_id=f"snapshot:{sandbox_id}:{record.snapshot_id}",
            )
        except Exception:
            await self._snapshots.delete(record.snapshot_id)  # nobody will act on it
            raise
        try:
            done = await self._snapshots.wait_for(
                record.snapshot_id,
                lambda r: r.state != SnapshotState.TAKING,
                timeout=max(wait, 0.1),
            )
        except TimeoutError:
            msg = (
                f"snapshot of {sandbox_id} did not finish within {wait:.0f}s; "
                "it is still queued and will complete"
            )
            raise TimeoutError(msg) from None
        if done.state == SnapshotState.READY:
            return done
        if done.state == SnapshotState.FAILED:
            await self._remove(done)
            raise _failure(done)
        raise NotFound(f"snapshot {record.snapshot_id} was deleted")

    async def _admit(self, record: SnapshotRecord) -> None:
        if record.internal or self._max_snapshots is None:
            return
        limit = await self._max_snapshots(record.owner)
        if not limit:
            return
        held = [
            s
            for s in await self._snapshots.list()
            if s.owner == record.owner and not s.internal and s.state in _LIVE
        ]
        if len(held) > limit:
            msg = f"quota: at most {limit} snapshots; delete some first"
            raise QuotaExceeded(msg, retry_after=QUOTA_RETRY_AFTER, retryable=False)

    # ---- reads ------------------------------------------------------------------------

    async def get(self, snapshot_id: str, *, owner: str | None) -> SnapshotRecord:
        """A ready snapshot of ``owner`` (``None``: any owner); ``NotFound`` otherwise."""
        snap = await self._snapshots.get(snapshot_id) if is_snapshot_id(snapshot_id) else None
        if (
            snap is None
            or snap.state != SnapshotState.READY
            or (owner is not None and snap.owner != owner)
            or snap.retain_until <= _now()
        ):
            raise NotFound(f"snapshot {snapshot_id} not found")
        return snap

    async def list(
        self, *, owner: str | None, sandbox_id: str | None = None, name: str | None = None
    ) -> list[SnapshotRecord]:
        """Ready, listed snapshots, newest first."""
        now = _now()
        found = [
            s
            for s in await self._snapshots.list()
            if s.state == SnapshotState.READY
            and not s.internal
            and s.retain_until > now
            and (owner is None or s.owner == owner)
            and (sandbox_id is None or s.source_sandbox_id == sandbox_id)
            and (name is None or s.name == name)
        ]
        return sorted(found, key=lambda s: (s.created_at, s.snapshot_id), reverse=True)

    # ---- delete -----------------------------------------------------------------------

    async def delete(self, snapshot_id: str, *, owner: str | None) -> None:
        """Hide it now (CAS to ``deleting``) and have the snapshotter remove it."""
        snap = await self._snapshots.get(snapshot_id) if is_snapshot_id(snapshot_id) else None
        if snap is None or (owner is not None and snap.owner != owner):
            raise NotFound(f"snapshot {snapshot_id} not found")

        def deleting(current: SnapshotRecord) -> SnapshotRecord:
            if current.state not in (SnapshotState.READY, SnapshotState.FAILED):
                raise NotFound(f"snapshot {snapshot_id} not found")
            return current.model_copy(update={"state": SnapshotState.DELETING})

        try:
            snap = await self._snapshots.update(snapshot_id, deleting)
        except Conflict as e:
            raise NotFound(f"snapshot {snapshot_id} not found") from e
        await self._remove(snap)

    async def _remove(self, snap: SnapshotRecord) -> None:
        await self._publisher.publish(
            DeleteSnapshot(
                sandbox_id=snap.source_sandbox_id,
                snapshot_id=snap.snapshot_id,
                reason="fork" if snap.internal else "user",
            ),
            subjects.of(subjects.CMD_SNAPSHOT_DELETE, snap.source_sandbox_id),
            msg_id=f"snapshot_delete:{snap.snapshot_id}",
        )


def _failure(snap: SnapshotRecord) -> TorporError:
    reason = snap.failure or "the snapshot failed"
    if snap.failure_status == 501:
        return Unsupported(reason)
    if snap.failure_status == 404:
        return NotFound(reason)
    return RuntimeFailure(f"snapshot of {snap.source_sandbox_id} failed: {reason}")
