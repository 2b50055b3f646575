"""Bringing a snapshot back into a workload: a stored snapshot's files before the first pod of a
sandbox made from it, and the snapshot's processes started once in each new pod (the replay),
unless the pod is the paused tree restored with its memory (``kept``: nothing to start).

Both are idempotent: the workload's annotations (``torpor.dev/restored-snapshot``,
``torpor.dev/replayed-snapshot = <snapshot id>@<pod uid>``) say what is done already, so a
redelivered command repeats nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import structlog

from shared.domain.record import SandboxRecord
from shared.errors import Conflict, NotFound, Unsupported
from shared.lifecycle.replay import plan, replay_key
from shared.lifecycle.worker import PermanentFailure
from shared.models.messages import ProcessOutcome
from shared.models.snapshots import Snapshot
from shared.ports.envd import Envd
from shared.ports.runtime import Runtime
from shared.ports.workloads import (
    ANNOTATION_REPLAYED,
    ANNOTATION_RESTORED,
    ANNOTATION_SNAPSHOT,
    Endpoint,
    Workload,
)

log = structlog.get_logger()

Progress = Callable[[], Awaitable[None]]
Mark = Callable[[str], None]  # ends a timed phase (``Spans.mark``)


def _no_mark(phase: str) -> None:
    del phase


@dataclass(frozen=True)
class Restorer:
    runtime: Runtime
    envd: Envd
    start_timeout: float = 10.0  # each ``List``/``Start`` call to the daemon

    async def origin_files(self, record: SandboxRecord, workload: Workload) -> Workload:
        """A sandbox started from a stored snapshot gets its files before its first pod, once
        (the workload's ``torpor.dev/restored-snapshot`` says it is done)."""
        snapshot_id = record.origin_snapshot_id
        assert snapshot_id is not None
        if workload.annotations.get(ANNOTATION_RESTORED) == snapshot_id:
            return workload
        try:
            await self.runtime.restore_files(snapshot_id, record.sandbox_id)
        except (NotFound, Unsupported, Conflict) as e:  # no retry brings the files back
            raise PermanentFailure(str(e)) from e
        return await self.runtime.patch_annotations(
            record.sandbox_id, {ANNOTATION_RESTORED: snapshot_id}
        )

    async def kept(self, record: SandboxRecord, endpoint: Endpoint) -> list[ProcessOutcome]:
        """The pod is the paused tree restored with its memory (``Endpoint.memory_kept``): its
        processes still run, so nothing is started; each snapshot process is reported with the
        pid it runs under now, or as gone."""
        value = record.snapshot.annotation if record.snapshot is not None else None
        if value is None:
            return []
        snapshot = Snapshot.decode(value)
        running = await self.envd.list_processes(
            endpoint, access_token=record.envd_access_token, timeout=self.start_timeout
        )
        outcomes = [
            ProcessOutcome(
                cmd=step.process.config.cmd,
                args=list(step.process.config.args),
                tag=step.process.tag,
                old_pid=step.process.pid,
                new_pid=step.running_pid,
                error=None if step.running_pid is not None else "not running after the restore",
            )
            for step in plan(snapshot.processes, running)
        ]
        log.info(
            "memory_kept",
            snapshot_id=snapshot.id,
            running=sum(1 for o in outcomes if o.new_pid is not None),
        )
        return outcomes

    async def replay(
        self,
        record: SandboxRecord,
        endpoint: Endpoint,
        annotations: Mapping[str, str],
        progress: Progress,
        mark: Mark = _no_mark,
    ) -> list[ProcessOutcome]:
        """Start every snapshot process once in this pod, in order; failures are reported."""
        value = annotations.get(ANNOTATION_SNAPSHOT)
        if value is None and record.snapshot is not None:
            value = record.snapshot.annotation
            await self.runtime.patch_annotations(record.sandbox_id, {ANNOTATION_SNAPSHOT: value})
        if value is None:
            return []  # never paused (e.g. resuming a failed create): nothing to replay
        snapshot = Snapshot.decode(value)
        key = replay_key(snapshot.id, endpoint.pod_uid)
        if annotations.get(ANNOTATION_REPLAYED) == key:
            log.info("replay_already_done", snapshot_id=snapshot.id, pod_uid=endpoint.pod_uid)
            return []
        token = record.envd_access_token
        running = await self.envd.list_processes(
            endpoint, access_token=token, timeout=self.start_timeout
        )
        mark("replay_list")
        outcomes: list[ProcessOutcome] = []
        for step in plan(snapshot.processes, running):
            p = step.process
            outcome = ProcessOutcome(
                cmd=p.config.cmd, args=list(p.config.args), tag=p.tag, old_pid=p.pid
            )
            if step.running_pid is not None:
                outcomes.append(outcome.model_copy(update={"new_pid": step.running_pid}))
                continue
            try:
                pid = await self.envd.start_process(
                    endpoint, p.config, tag=p.tag, access_token=token, timeout=self.start_timeout
                )
                outcomes.append(outcome.model_copy(update={"new_pid": pid}))
            except Exception as e:
                log.warning(
                    "replay_process_failed", cmd=p.config.cmd, args=p.config.args, error=repr(e)
                )
                outcomes.append(
                    outcome.model_copy(update={"error": f"{type(e).__name__}: {e}"[:500]})
                )
            await progress()
        mark("replay_start")
        await self.runtime.patch_annotations(record.sandbox_id, {ANNOTATION_REPLAYED: key})
        log.info(
            "replayed",
            snapshot_id=snapshot.id,
            started=sum(1 for o in outcomes if o.new_pid is not None),
            failed=sum(1 for o in outcomes if o.error is not None),
        )
        return outcomes
