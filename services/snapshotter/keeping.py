"""Stored snapshots (E2B ``create_snapshot``, fork): take one of a sandbox, delete one.

Take (``sandbox.cmd.snapshot.<sid>``), each step safe to repeat:
1. Read the snapshot record (written ``taking`` by the api). ``ready``: publish the event again
   (deduplicated) and stop; ``failed``/``deleting``/gone: nothing to do.
2. The process list: a running sandbox's from its daemon (``List``), as a pause captures it; a
   paused sandbox's is the one its pause stored. The sandbox keeps running: the snapshot is live.
3. The files: the runtime copies the sandbox's writable files under the snapshot id
   (``Runtime.save_files``; ``Unsupported`` where it cannot, and the snapshot fails with that
   reason instead of being stored without them).
4. CAS the record ``taking → ready`` with the process list; publish ``snapshot_taken``
   (``snapshot_taken:<sid>:<snapshot id>``).

Delete (``sandbox.cmd.snapshot_delete.<sid>``): CAS to ``deleting`` (hidden from then on), remove
the files, remove the record, publish ``snapshot_deleted``. Sandboxes started from the snapshot
are not touched: they got copies.
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Literal, Protocol

import structlog

from shared.bus import subjects
from shared.bus.retry import Retry
from shared.domain import states
from shared.domain import transitions as t
from shared.domain.record import SandboxRecord
from shared.domain.states import SandboxState
from shared.errors import EnvdUnavailable, NotFound, Unsupported
from shared.lifecycle.pods import current_endpoint
from shared.lifecycle.worker import PermanentFailure
from shared.models.messages import DeleteSnapshot, SnapshotDeleted, SnapshotTaken, TakeSnapshot
from shared.models.snapshot_records import SnapshotRecord, SnapshotState
from shared.models.snapshots import MAX_SNAPSHOT_ANNOTATION_BYTES, Snapshot
from shared.ports.bus import Publisher, SandboxStore, SnapshotStore
from shared.ports.envd import Envd
from shared.ports.runtime import Runtime
from shared.redaction import redact_text

log = structlog.get_logger()

Outcome = Literal["done", "skipped"]


class RetentionTimers(Protocol):
    """Arms a stored snapshot's end of retention (``shared.bus.snapshot_timers``)."""

    async def arm(self, sandbox_id: str, snapshot_id: str, due: datetime) -> None: ...


class SnapshotKeeper:
    def __init__(
        self,
        *,
        sandboxes: SandboxStore,
        snapshots: SnapshotStore,
        runtime: Runtime,
        envd: Envd,
        publisher: Publisher,
        timers: RetentionTimers | None = None,
        envd_timeout: float = 10.0,
        limit: int = MAX_SNAPSHOT_ANNOTATION_BYTES,
    ) -> None:
        self._timers = timers
        self._sandboxes = sandboxes
        self._snapshots = snapshots
        self._runtime = runtime
        self._envd = envd
        self._publisher = publisher
        self._envd_timeout = envd_timeout
        self._limit = limit

    # ---- take -------------------------------------------------------------------------

    async def take(self, cmd: TakeSnapshot) -> Outcome:
        snap = await self._snapshots.get(cmd.snapshot_id)
        if snap is None or snap.source_sandbox_id != cmd.sandbox_id:
            return "skipped"
        if snap.state == SnapshotState.READY:
            await self._arm(snap)  # done before; the timer or the event may be missing
            await self._publish_taken(snap)
            return "skipped"
        if snap.state != SnapshotState.TAKING:
            return "skipped"
        sandbox = await self._sandboxes.get(cmd.sandbox_id)
        if sandbox is None or states.is_gone(sandbox.state):
            await self.give_up_take(cmd, f"sandbox {cmd.sandbox_id} not found", status=404)
            return "done"
        if snap.files_only:
            annotation = Snapshot.capture([], at=t.now()).encode(limit=self._limit)
        else:
            annotation = await self._process_list(sandbox)
        try:
            files_bytes = await self._runtime.save_files(cmd.sandbox_id, cmd.snapshot_id)
        except Unsupported as e:
            await self.give_up_take(cmd, str(e), status=501)
            return "done"
        except NotFound:
            await self.give_up_take(cmd, f"sandbox {cmd.sandbox_id} not found", status=404)
            return "done"
        count = len(Snapshot.decode(annotation).processes)
        snap = await self._end_taking(
            cmd.snapshot_id,
            {
                "state": SnapshotState.READY,
                "annotation": annotation,
                "process_count": count,
                "files_bytes": files_bytes,
            },
        )
        if snap is None or snap.state != SnapshotState.READY:
            # Deleted while being taken: the delete may have run before the copy existed.
            await self._runtime.delete_snapshot_files(cmd.snapshot_id)
            return "skipped"
        await self._arm(snap)
        await self._publish_taken(snap)
        log.info("snapshot_taken", snapshot_id=snap.snapshot_id, processes=count)
        return "done"

    async def _end_taking(
        self, snapshot_id: str, update: dict[str, object]
    ) -> SnapshotRecord | None:
        """Write ``update`` on a snapshot being taken (one no longer taking is left as it is);
        None when its record is gone."""

        def end(current: SnapshotRecord) -> SnapshotRecord:
            if current.state != SnapshotState.TAKING:
                return current
            return current.model_copy(update=update)

        try:
            return await self._snapshots.update(snapshot_id, end)
        except NotFound:
            return None

    async def _process_list(self, sandbox: SandboxRecord) -> str:
        if states.is_running(sandbox.state):
            endpoint = await current_endpoint(self._runtime, sandbox)
            if endpoint is None:
                raise EnvdUnavailable(f"sandbox {sandbox.sandbox_id} has no pod to snapshot")
            processes = await self._envd.list_processes(
                endpoint, access_token=sandbox.envd_access_token, timeout=self._envd_timeout
            )
            return Snapshot.capture(processes, at=t.now()).encode(limit=self._limit)
        if sandbox.state == SandboxState.PAUSED and sandbox.snapshot is not None:
            return sandbox.snapshot.annotation  # what its resume would replay
        if states.is_transitional(sandbox.state):
            raise Retry(f"sandbox is {sandbox.state.value}; snapshot after it", delay=1.0)
        raise PermanentFailure(f"sandbox {sandbox.sandbox_id} is {sandbox.state.value}")

    async def _arm(self, snap: SnapshotRecord) -> None:
        if self._timers is not None and not snap.internal:  # fork's own goes with the fork
            await self._timers.arm(snap.source_sandbox_id, snap.snapshot_id, snap.retain_until)

    async def _publish_taken(self, snap: SnapshotRecord) -> None:
        sid = snap.source_sandbox_id
        sandbox = await self._sandboxes.get(sid)
        await self._publisher.publish(
            SnapshotTaken(
                sandbox_id=sid,
                generation=sandbox.generation if sandbox is not None else 0,
                at=t.now(),
                snapshot_id=snap.snapshot_id,
                process_count=snap.process_count,
            ),
            subjects.of(subjects.EVT_SNAPSHOT_TAKEN, sid),
            msg_id=f"snapshot_taken:{sid}:{snap.snapshot_id}",
        )

    async def give_up_take(self, cmd: TakeSnapshot, reason: str, *, status: int = 500) -> None:
        """The take failed for good: the record says why (and which HTTP status the caller
        gets); the api removes failed snapshots."""
        failed = {
            "state": SnapshotState.FAILED,
            "failure": redact_text(reason)[:1000],
            "failure_status": status,
        }
        if await self._end_taking(cmd.snapshot_id, failed) is None:
            return
        # The files may be half-copied: they go now (a failed snapshot is never used).
        await self._runtime.delete_snapshot_files(cmd.snapshot_id)
        log.error("snapshot_failed", snapshot_id=cmd.snapshot_id, reason=reason)

    # ---- retention ----------------------------------------------------------------------

    async def expire(self, cmd: DeleteSnapshot) -> Outcome:
        """The retention timer fired: delete the snapshot if it is still there and due."""
        snap = await self._snapshots.get(cmd.snapshot_id)
        if snap is None or snap.source_sandbox_id != cmd.sandbox_id:
            return "skipped"  # deleted by its owner before
        if snap.retain_until > t.now():
            await self._arm(snap)  # not due (clock skew): wait again
            return "skipped"
        return await self.delete(cmd)

    # ---- delete -------------------------------------------------------------------------

    async def delete(self, cmd: DeleteSnapshot) -> Outcome:
        def deleting(current: SnapshotRecord) -> SnapshotRecord:
            if current.state == SnapshotState.DELETING:
                return current
            return current.model_copy(update={"state": SnapshotState.DELETING})

        found = await self._snapshots.get(cmd.snapshot_id)
        if found is not None:
            if found.source_sandbox_id != cmd.sandbox_id:
                return "skipped"  # the subject names another sandbox: not this snapshot
            with contextlib.suppress(NotFound):  # deleted meanwhile: finish the same way
                await self._snapshots.update(cmd.snapshot_id, deleting)
        await self._runtime.delete_snapshot_files(cmd.snapshot_id)
        await self._snapshots.delete(cmd.snapshot_id)
        await self._publisher.publish(
            SnapshotDeleted(
                sandbox_id=cmd.sandbox_id, generation=0, at=t.now(), snapshot_id=cmd.snapshot_id
            ),
            subjects.of(subjects.EVT_SNAPSHOT_DELETED, cmd.sandbox_id),
            msg_id=f"snapshot_deleted:{cmd.snapshot_id}",
        )
        log.info("snapshot_deleted", snapshot_id=cmd.snapshot_id, reason=cmd.reason)
        return "done"
