"""The scaler: moves workloads between 0 and 1 replicas, replays snapshots, deletes workloads.

Every operation is a sequence of idempotent effects between two compare-and-set steps on the
record, so a redelivered message (crash, ack timeout, duplicate on another replica) repeats
harmless work and the record says exactly how far a sandbox got:

- create   ``creating`` → (create workload, scale 1, wait ready) → ``running``
- pause    ``pausing`` + stored snapshot → (check the annotation is that snapshot, scale 0, wait
           stopped) → ``paused``. Never scales to 0 unless the workload carries the snapshot.
- resume   ``paused|failed`` → ``resuming`` → (scale 1, wait until the daemon answers, replay
           once per pod, wait ready) → ``running``; the replay (and a snapshot's files on
           create) is ``restoring.py``.
           Onto the pod a pause failed on (still running), its processes, which a held
           kept-files export may keep stopped, are continued first (best effort).
- kill     any → ``killing`` → (delete workload) → ``killed`` (a tombstone)

An operation that loses its record to a concurrent kill cleans up the workload it may have
(re)created. Events are published after the CAS with ids derived from the new generation; a
redelivery that finds the work done publishes the same id again (deduplicated by the stream), so
a crash between the CAS and the publish never loses an event.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Literal

import structlog
from prometheus_client import CollectorRegistry

from services.scaler.metrics import ScalerMetrics
from services.scaler.reports import Spans, path_of, resume_report
from services.scaler.restoring import Progress, Restorer
from shared.bus.retry import Retry
from shared.domain import states
from shared.domain import transitions as t
from shared.domain.record import SandboxRecord
from shared.errors import IllegalTransition, NotFound, ReadyFailed, TorporError
from shared.lifecycle.hooks import HookRunner, describe, refusal
from shared.lifecycle.pods import ensure_workload, workload_spec
from shared.lifecycle.worker import PermanentFailure, fail_transition
from shared.models.lifecycle import TemplateFacts, unknown_template
from shared.models.messages import (
    CreateSandbox,
    KillSandbox,
    ProcessOutcome,
    ResumeSandbox,
    SandboxCreated,
    SandboxFailed,
    SandboxKilled,
    SandboxPaused,
    SandboxResumed,
    SandboxSnapshotted,
    SetSandboxNetwork,
)
from shared.ports.bus import Publisher, SandboxStore, emit
from shared.ports.envd import Envd
from shared.ports.runtime import Runtime
from shared.ports.workloads import ANNOTATION_RESUME_MEMORY, ANNOTATION_SNAPSHOT, Endpoint, Workload

log = structlog.get_logger()

Outcome = Literal["done", "skipped"]


async def _no_progress() -> None:
    return None


class Scaler:
    def __init__(
        self,
        *,
        store: SandboxStore,
        runtime: Runtime,
        envd: Envd,
        publisher: Publisher,
        ready_timeout: float = 60.0,
        stop_timeout: float = 60.0,
        start_timeout: float = 10.0,
        retention: timedelta = timedelta(days=30),
        tombstone_for: timedelta = timedelta(days=1),
        templates: Callable[[str], TemplateFacts] = unknown_template,
        metrics: ScalerMetrics | None = None,
    ) -> None:
        self._metrics = metrics if metrics is not None else ScalerMetrics(CollectorRegistry())
        self._store = store
        self._runtime = runtime
        self._restorer = Restorer(runtime, envd, start_timeout)
        self._publisher = publisher
        self._ready_timeout = ready_timeout
        self._stop_timeout = stop_timeout
        self._retention = retention
        self._tombstone_for = tombstone_for
        self._templates = templates
        self._hooks = HookRunner(envd=envd, publisher=publisher)

    # ---- create -------------------------------------------------------------------------

    async def create(self, cmd: CreateSandbox, cmd_msg_id: str) -> Outcome:
        sid = cmd.sandbox_id
        started = time.monotonic()
        spans = Spans(started)
        try:
            record = await self._store.update(sid, t.begin("create", cmd_msg_id, generation=None))
            spans.mark("begin")
        except NotFound:
            return "skipped"
        except IllegalTransition:
            current = await self._store.get(sid)
            if current is not None and t.done_before("create", current):
                await self._publish_created(current)  # done before; the event may be missing
            return "skipped"
        from_snapshot = record.origin_snapshot_id is not None and record.origin is not None
        try:
            # From a snapshot: no pod before its files are in (restored into the new layer).
            workload = await self._runtime.create(
                workload_spec(record, replicas=0 if from_snapshot else 1)
            )
        except NotFound as e:  # the template does not exist: no retry can fix that
            if await self._clean_up_if_killed(sid):
                return "skipped"
            raise PermanentFailure(str(e)) from e
        spans.mark("workload")
        if from_snapshot:
            workload = await self._restorer.origin_files(record, workload)
        if workload.replicas != 1:  # made at 0 (from a snapshot, or by an earlier attempt)
            await self._runtime.scale(sid, 1)
            spans.mark("scale")
        try:
            endpoint = await self._runtime.wait_ready(sid, timeout=self._ready_timeout)
        except ReadyFailed as e:  # the template's ready command never succeeded: no retry heals
            await self._runtime.delete(sid)
            raise PermanentFailure(str(e)) from e
        spans.mark("ready")
        outcomes = (
            await self._restorer.replay(record, endpoint, workload.annotations, _no_progress)
            if from_snapshot
            else []
        )
        try:
            record = await self._store.update(
                sid,
                t.running(
                    op="create",
                    cmd_msg_id=cmd_msg_id,
                    host=endpoint.host,
                    pod_uid=endpoint.pod_uid,
                    path=path_of(endpoint),
                ),
            )
        except IllegalTransition:
            await self._clean_up_if_killed(sid)
            raise
        spans.mark("commit")
        await self._publish_created(record, outcomes)
        spans.mark("publish")
        self._metrics.observe("create", "done", time.monotonic() - started)
        log.info("create_timing", path=record.path, **spans.as_ms())
        return "done"

    async def _publish_created(
        self, record: SandboxRecord, outcomes: list[ProcessOutcome] | None = None
    ) -> None:
        """From the record: a redelivery republishes the path the pod came by."""
        sid = record.sandbox_id
        await emit(
            self._publisher,
            SandboxCreated(
                sandbox_id=sid,
                generation=record.generation,
                at=t.now(),
                origin_snapshot_id=record.origin_snapshot_id,
                path=record.path or "cold",
                processes=outcomes or [],
            ),
        )

    # ---- pause (second half) ------------------------------------------------------------

    async def finish_pause(
        self, event: SandboxSnapshotted, progress: Progress = _no_progress
    ) -> Outcome:
        sid = event.sandbox_id
        record = await self._store.get(sid)
        if record is None:
            return "skipped"
        if t.done_before("pause", record, generation=event.generation):
            await self._publish_paused(record)  # done before; the event may be missing
            return "skipped"
        ref = t.snapshot_of_this_pause(record)
        if record.generation != event.generation or ref is None:
            log.info("pause_not_applicable", state=record.state.value, generation=record.generation)
            return "skipped"
        workload = await self._runtime.get(sid)
        if workload is not None:
            if workload.annotations.get(ANNOTATION_SNAPSHOT) != ref.annotation:
                # A duplicate capture may have overwritten the annotation: the record is the
                # truth, and the workload must carry it before its pod may go.
                await self._runtime.patch_annotations(sid, {ANNOTATION_SNAPSHOT: ref.annotation})
                workload = await self._runtime.get(sid)
                if (
                    workload is None
                    or workload.annotations.get(ANNOTATION_SNAPSHOT) != ref.annotation
                ):
                    raise Retry("snapshot annotation not stored yet", delay=1.0)
            await self._runtime.scale(sid, 0)
            await progress()
            await self._runtime.wait_stopped(sid, timeout=self._stop_timeout)
        begun = record.pending.started_at if record.pending else None
        try:
            record = await self._store.update(
                sid, t.paused(generation=event.generation, retention=self._retention)
            )
        except IllegalTransition:
            await self._clean_up_if_killed(sid)
            raise
        await self._publish_paused(record)
        if begun is not None and record.paused_at is not None:
            self._metrics.observe("pause", "done", (record.paused_at - begun).total_seconds())
        else:
            self._metrics.observe("pause", "done", None)
        return "done"

    async def _publish_paused(self, record: SandboxRecord) -> None:
        sid = record.sandbox_id
        await emit(
            self._publisher,
            SandboxPaused(
                sandbox_id=sid,
                generation=record.generation,
                at=t.now(),
                snapshot_id=record.snapshot.id if record.snapshot else None,
            ),
        )

    # ---- resume -------------------------------------------------------------------------

    async def resume(
        self, cmd: ResumeSandbox, cmd_msg_id: str, progress: Progress = _no_progress
    ) -> Outcome:
        sid = cmd.sandbox_id
        started = time.monotonic()
        spans = Spans(started)
        try:
            record = await self._store.update(
                sid, t.begin("resume", cmd_msg_id, generation=cmd.generation)
            )
            spans.mark("claim")
        except NotFound:
            return "skipped"
        except IllegalTransition:
            current = await self._store.get(sid)
            if current is None:
                return "skipped"
            if t.waits_for_pause(current, generation=cmd.generation):
                raise Retry("a pause is in flight; resume after it", delay=2.0) from None
            if t.done_before("resume", current, generation=cmd.generation):
                await self._publish_resumed(current)  # done before; the event may be missing
            return "skipped"
        try:
            workload = await ensure_workload(self._runtime, record)
            workload = await self._choose_memory(workload, cmd)
            spans.mark("workload")
            await self._runtime.scale(sid, 1)
            spans.mark("scale")
            await progress()
            deadline = time.monotonic() + self._ready_timeout
            # Replay once the daemon answers, before its ready command passes: the command may
            # check what the template's start command (replayed like any process) starts.
            try:  # (a runtime that cannot tell answering from ready fails here)
                endpoint = await self._runtime.wait_ready(
                    sid, timeout=self._ready_timeout, answering=True
                )
            except ReadyFailed as e:  # the template's ready command never succeeded
                return await self._fail_back_to_paused(record, cmd_msg_id, str(e))
            spans.mark("answering")
            if endpoint.pod_uid == record.pod_uid:
                await self._continue_held(sid)
            await progress()
            if endpoint.memory_kept:  # the paused processes still run: no replay
                outcomes = await self._restorer.kept(record, endpoint)
            else:
                # Annotations as read before the scale: only this resume writes them meanwhile.
                outcomes = await self._restorer.replay(
                    record, endpoint, workload.annotations, progress, spans.mark
                )
            spans.mark("replay_mark")
            try:
                ready = await self._runtime.wait_ready(
                    sid, timeout=max(deadline - time.monotonic(), 1.0)
                )
            except ReadyFailed as e:  # the template's ready command never succeeded
                return await self._fail_back_to_paused(record, cmd_msg_id, str(e))
            if ready.pod_uid != endpoint.pod_uid:  # replaced meanwhile: replay into the new one
                raise Retry("the resumed pod was replaced before it was ready", delay=1.0)
            spans.mark("ready")
            facts = self._templates(record.template)
            hooks = await self._hooks.run("postResume", "resume", record, endpoint, facts.hooks)
            spans.mark("hooks")
            refused = refusal(hooks)
            if refused is not None:  # the sandbox says it did not come back: the resume fails
                raise PermanentFailure(describe(refused))
            snapshot_id = record.snapshot.id if record.snapshot else None
            report = resume_report(
                record,
                snapshot_id,
                outcomes,
                facts,
                spans.timings(),
                path=path_of(endpoint),
                memory=endpoint,
            ).model_copy(update={"hooks": hooks})
            record = await self._store.update(
                sid,
                t.running(
                    op="resume",
                    cmd_msg_id=cmd_msg_id,
                    host=endpoint.host,
                    pod_uid=endpoint.pod_uid,
                    path=report.path,
                    timeout=cmd.timeout,
                    auto_pause=cmd.auto_pause,
                    report=report,
                ),
            )
            spans.mark("commit")
        except (IllegalTransition, NotFound):
            if await self._clean_up_if_killed(sid):
                return "skipped"
            raise
        await self._publish_resumed(record)
        spans.mark("publish")
        self._metrics.observe("resume", "done", time.monotonic() - started)
        log.info("resume_timing", **spans.as_ms())
        for o in outcomes:
            self._metrics.replayed.labels("ok" if o.error is None else "error").inc()
        return "done"

    async def _choose_memory(self, workload: Workload, cmd: ResumeSandbox) -> Workload:
        """Tell the runtime whether this resume restores a kept memory image (each resume
        chooses anew; written only when it changes, so a plain resume costs no extra call)."""
        wanted = "false" if cmd.memory is False else "true"
        if workload.annotations.get(ANNOTATION_RESUME_MEMORY, "true") == wanted:
            return workload
        return await self._runtime.patch_annotations(
            cmd.sandbox_id, {ANNOTATION_RESUME_MEMORY: wanted}
        )

    async def _continue_held(self, sandbox_id: str) -> None:
        """The pod a pause failed on still runs (resumed from ``failed``): a held kept-files
        export may keep its processes stopped until its hold ends; continue them now. Best
        effort: the hold runs out anyway."""
        try:
            await self._runtime.thaw_files(sandbox_id)
        except TorporError as e:
            log.warning("resume_thaw_failed", error=str(e)[:300])

    async def _fail_back_to_paused(
        self, record: SandboxRecord, cmd_msg_id: str, reason: str
    ) -> Outcome:
        """A resumed pod that never became ready: no retry heals it, and the sandbox's snapshot
        is untouched (a replay only starts processes in the pod), so the pod stops again and
        the sandbox stays paused with the reason; ``sandbox.evt.failed`` (op ``resume``)
        answers the waiter."""
        sid = record.sandbox_id
        if not t.can_fail_back_to_paused(record):
            await self._runtime.scale(sid, 0)
            raise PermanentFailure(reason)
        await self._runtime.scale(sid, 0)
        await self._runtime.wait_stopped(sid, timeout=self._stop_timeout)
        record = await self._store.update(sid, t.resume_failed(cmd_msg_id, reason))
        await emit(
            self._publisher,
            SandboxFailed(
                sandbox_id=sid,
                generation=record.generation,
                at=t.now(),
                op="resume",
                reason=reason,
            ),
        )
        self._metrics.observe("resume", "failed", None)
        log.warning("resume_failed_back_to_paused", reason=reason)
        return "done"

    async def _publish_resumed(self, record: SandboxRecord) -> None:
        """From the record: a redelivery republishes the same report (and the same id)."""
        report = record.last_resume
        await emit(
            self._publisher,
            SandboxResumed(
                sandbox_id=record.sandbox_id,
                generation=record.generation,
                at=t.now(),
                path=report.path if report is not None else "cold",
                processes=report.processes if report is not None else [],
                report=report,
            ),
        )

    # ---- network ------------------------------------------------------------------------

    async def apply_network(self, cmd: SetSandboxNetwork) -> Outcome:
        """Make the workload's policy the record's (the record is the truth: the last update
        written wins, whatever order the commands run in). Kept by the runtime across scale
        0/1; a workload created later gets it from ``workload_spec``."""
        sid = cmd.sandbox_id
        record = await self._store.get(sid)
        if record is None or states.is_gone(record.state):
            return "skipped"
        try:
            await self._runtime.set_network(sid, record.network)
        except NotFound:
            if states.is_starting(record.state):
                # Another replica may be creating the workload from an older record.
                raise Retry("the workload is being created; apply after it", delay=1.0) from None
            return "skipped"
        log.info(
            "network_applied",
            allow_internet=record.network.allow_internet,
            allow_out=len(record.network.allow_out),
            deny_out=len(record.network.deny_out),
            allow_public_traffic=record.network.allow_public_traffic,
        )
        return "done"

    # ---- kill ---------------------------------------------------------------------------

    async def kill(self, cmd: KillSandbox, cmd_msg_id: str) -> Outcome:
        """User and platform kills apply whatever happened since; timeout and retention kills
        only for the generation they were decided on (a resumed sandbox is not expired)."""
        sid = cmd.sandbox_id
        started = time.monotonic()
        guard = cmd.generation if cmd.reason in ("timeout", "retention") else None
        try:
            record = await self._store.update(sid, t.begin("kill", cmd_msg_id, generation=guard))
        except NotFound:
            return "skipped"
        except IllegalTransition:
            current = await self._store.get(sid)
            if current is not None and t.done_before("kill", current):
                await self._publish_killed(current)
            return "skipped"
        await self._pre_kill(record)
        await self._runtime.delete(sid)
        record = await self._store.update(
            sid, t.killed(cmd_msg_id, tombstone_for=self._tombstone_for)
        )
        await self._publish_killed(record)
        self._metrics.observe("kill", "done", time.monotonic() - started)
        return "done"

    async def _pre_kill(self, record: SandboxRecord) -> None:
        """The preKill hooks, when the sandbox has a pod to run them in (a paused one has none).
        Their failures are recorded, never a reason to keep the sandbox."""
        try:
            workload = await self._runtime.get(record.sandbox_id)
            if workload is None or not (workload.pod_ip and workload.pod_uid):
                return
            endpoint = Endpoint(host=workload.pod_ip, pod_uid=workload.pod_uid)
            template = self._templates(record.template).hooks
            await self._hooks.run("preKill", "kill", record, endpoint, template)
        except Exception as e:  # a kill goes ahead whatever its hooks did
            log.warning("pre_kill_hooks_failed", error=repr(e))

    async def _publish_killed(self, record: SandboxRecord) -> None:
        sid = record.sandbox_id
        await emit(
            self._publisher,
            SandboxKilled(sandbox_id=sid, generation=record.generation, at=t.now()),
        )

    async def _clean_up_if_killed(self, sandbox_id: str) -> bool:
        """After losing the record to a kill: delete what this operation may have re-created."""
        current = await self._store.get(sandbox_id)
        if current is None or states.is_gone(current.state):
            await self._runtime.delete(sandbox_id)
            return True
        return False

    # ---- giving up ----------------------------------------------------------------------

    async def give_up(
        self,
        op: t.Op,
        sandbox_id: str,
        reason: str,
        *,
        cmd_msg_id: str | None = None,
        generation: int | None = None,
    ) -> None:
        await fail_transition(
            self._store,
            self._publisher,
            op,
            sandbox_id,
            reason,
            cmd_msg_id=cmd_msg_id,
            generation=generation,
        )
        self._metrics.observe(op, "failed", None)
        log.error("transition_failed", op=op, reason=reason)
