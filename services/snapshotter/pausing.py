"""The snapshotter's half of a pause: running → pausing, List processes, store the snapshot.

Order of effects, each safe to repeat:
1. CAS ``running → pausing`` owned by the command's message id (a redelivery continues).
2. ``List`` the daemon's processes and build the snapshot (``Snapshot.capture``).
3. Patch the workload: the snapshot annotation, the replay key of the pod it was captured
   from (that pod already runs these processes), and whether the pause keeps memory
   (``torpor.dev/pause-memory``, the command's ``memory``; the local runtime dumps the pod with
   CRIU when it stops it, docs/memory-pause.md).
4. CAS the snapshot (a full copy of the annotation value) into the record.
5. ``Runtime.keep_files``: the files the pod's disk would lose go to the kept-files store
   (Kubernetes ``persist: store``; a no-op elsewhere). Repeated on a redelivery (the newer copy
   replaces the older). If it fails, nothing is published: the pod keeps running and the pause
   fails (``failed`` with the reason, after the retries). The pod's processes are stopped for
   the export and stay stopped for ``hold`` seconds (``SnapshotterSettings.pause_hold_seconds``)
   so the pod stops with nothing written after the copy; a pause that fails continues them
   (``give_up``: best effort, the hold runs out anyway).
6. Publish ``snapshotted`` (id ``snapshotted:<sid>:g<gen>``): the scaler scales to 0 only after
   checking the workload carries exactly this stored snapshot.

Before step 2, the ``prePause`` hooks run (``shared.lifecycle.hooks``: the template's, then the
sandbox's). One with ``onFailure: abort`` that fails refuses the pause: ``pausing → running``
with the outcome on the record (``refused_pause``) and a fresh timeout; nothing was captured and
the pod never stopped. The api answers the waiting pause 409 with the outcome. A timeout (or
platform) pause past the template's ``maxLifetime`` is not refused: the abort is recorded as
``overridden`` and the pause proceeds (``shared.lifecycle.hooks.abort_honoured``).

A snapshot over the annotation budget (``MAX_SNAPSHOT_ANNOTATION_BYTES``, 200 KiB of the 256 KiB
Kubernetes allows for all annotations) fails the pause: the sandbox goes to ``failed`` with the
reason and keeps running untouched. Dropping envs or processes would make a later resume quietly
start something different from what ran; refusing keeps every process and tells the user why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

import structlog
from prometheus_client import CollectorRegistry

from services.snapshotter.metrics import SnapshotterMetrics
from shared.domain import transitions as t
from shared.domain.record import SandboxRecord, SnapshotRef
from shared.errors import EnvdUnavailable, IllegalTransition, NotFound, TorporError
from shared.lifecycle.hooks import HookRunner, abort_honoured, describe, refusal
from shared.lifecycle.pods import current_endpoint
from shared.lifecycle.replay import replay_key
from shared.lifecycle.worker import fail_transition
from shared.models.lifecycle import TemplateFacts, unknown_template
from shared.models.messages import PauseSandbox, SandboxSnapshotted
from shared.models.snapshots import MAX_SNAPSHOT_ANNOTATION_BYTES, Snapshot
from shared.ports.bus import Publisher, SandboxStore, emit
from shared.ports.envd import Envd
from shared.ports.runtime import Runtime
from shared.ports.workloads import (
    ANNOTATION_PAUSE_MEMORY,
    ANNOTATION_REPLAYED,
    ANNOTATION_SNAPSHOT,
    Endpoint,
)

log = structlog.get_logger()

Outcome = Literal["snapshotted", "skipped", "refused"]


class Snapshotter:
    def __init__(
        self,
        *,
        store: SandboxStore,
        runtime: Runtime,
        envd: Envd,
        publisher: Publisher,
        envd_timeout: float = 10.0,
        limit: int = MAX_SNAPSHOT_ANNOTATION_BYTES,
        templates: Callable[[str], TemplateFacts] = unknown_template,
        hold: float = 0.0,
        metrics: SnapshotterMetrics | None = None,
    ) -> None:
        self._metrics = metrics if metrics is not None else SnapshotterMetrics(CollectorRegistry())
        self._store = store
        self._runtime = runtime
        self._envd = envd
        self._publisher = publisher
        self._envd_timeout = envd_timeout
        self._limit = limit
        self._templates = templates
        self._hold = hold
        self._hooks = HookRunner(envd=envd, publisher=publisher)

    async def pause(self, cmd: PauseSandbox, cmd_msg_id: str) -> Outcome:
        sid = cmd.sandbox_id
        started = time.monotonic()
        try:
            record = await self._store.update(
                sid, t.begin("pause", cmd_msg_id, generation=cmd.generation)
            )
        except (IllegalTransition, NotFound) as e:
            log.info("pause_not_applicable", reason=str(e))
            self._metrics.snapshots.labels("skipped").inc()
            return "skipped"
        ref = t.snapshot_of_this_pause(record)
        if ref is None:  # not captured yet (a redelivery after step 4 skips to the publish)
            endpoint = await current_endpoint(self._runtime, record)
            if endpoint is None:
                msg = f"sandbox {record.sandbox_id} has no running pod to snapshot"
                raise EnvdUnavailable(msg)
            facts = self._templates(record.template)
            may_abort = abort_honoured(
                cmd.reason,
                started_at=record.started_at,
                max_lifetime=facts.activity.max_lifetime,
                at=t.now(),
            )
            outcomes = await self._hooks.run(
                "prePause", "pause", record, endpoint, facts.hooks, may_abort=may_abort
            )
            refused = refusal(outcomes)
            if refused is not None:
                await self._store.update(sid, t.pause_refused(cmd_msg_id, refused))
                self._metrics.snapshots.labels("refused").inc()
                log.info("pause_refused", reason=describe(refused), reason_by=cmd.reason)
                return "refused"
            record, ref = await self._capture(record, cmd_msg_id, endpoint, memory=cmd.memory)
        # After the capture, before the scaler may stop the pod (it waits for ``snapshotted``):
        # files the pod's disk would lose go to the kept-files store (Kubernetes ``persist:
        # store``). A failure fails the pause here, with the pod still running. Its processes
        # stay stopped after the export (``hold``), so the pod stops with nothing written since.
        await self._runtime.keep_files(sid, hold=self._hold)
        await emit(
            self._publisher,
            SandboxSnapshotted(
                sandbox_id=sid,
                generation=record.generation,
                at=t.now(),
                snapshot_id=ref.id,
                process_count=ref.process_count,
            ),
        )
        self._metrics.seconds.observe(time.monotonic() - started)
        self._metrics.snapshots.labels("snapshotted").inc()
        log.info("snapshotted", snapshot_id=ref.id, processes=ref.process_count)
        return "snapshotted"

    async def _capture(
        self, record: SandboxRecord, cmd_msg_id: str, endpoint: Endpoint, *, memory: bool
    ) -> tuple[SandboxRecord, SnapshotRef]:
        processes = await self._envd.list_processes(
            endpoint, access_token=record.envd_access_token, timeout=self._envd_timeout
        )
        snapshot = Snapshot.capture(processes, at=t.now())
        value = snapshot.encode(limit=self._limit)  # SnapshotTooLarge: fail the pause, see above
        self._metrics.processes.observe(len(processes))
        self._metrics.bytes.observe(len(value))
        await self._runtime.patch_annotations(
            record.sandbox_id,
            {
                ANNOTATION_SNAPSHOT: value,
                ANNOTATION_REPLAYED: replay_key(snapshot.id, endpoint.pod_uid),
                # Read by the runtime when it stops the pod (set on every pause: the last
                # pause's choice must not carry over to the next one).
                ANNOTATION_PAUSE_MEMORY: "true" if memory else "false",
            },
        )
        ref = SnapshotRef(
            id=snapshot.id,
            captured_at=snapshot.captured_time,
            process_count=len(processes),
            annotation=value,
        )
        record = await self._store.update(record.sandbox_id, t.store_snapshot(cmd_msg_id, ref))
        return record, ref

    async def give_up(self, cmd: PauseSandbox, cmd_msg_id: str, reason: str) -> None:
        """Fail the pause on the record (the pod keeps running; nothing was scaled down), and
        continue its processes if a held export stopped them."""
        await fail_transition(
            self._store, self._publisher, "pause", cmd.sandbox_id, reason, cmd_msg_id=cmd_msg_id
        )
        if self._hold > 0:
            try:
                await self._runtime.thaw_files(cmd.sandbox_id)
            except TorporError as e:  # best effort: the daemon's hold runs out by itself
                log.warning("pause_thaw_failed", error=str(e)[:300])
        self._metrics.snapshots.labels("failed").inc()
        log.error("pause_failed", reason=reason)
