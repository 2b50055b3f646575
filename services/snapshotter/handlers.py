"""The snapshotter's subscriber: ``sandbox.cmd.pause.<sid>`` on the durable
``snapshotter-pause``."""

from __future__ import annotations

from faststream.nats import NatsMessage, NatsRouter

from services.snapshotter.pausing import Snapshotter
from shared.bus import subjects
from shared.bus.broker import subscriber_args
from shared.bus.retry import RetryPolicy
from shared.bus.topology import SNAPSHOTTER_PAUSE
from shared.lifecycle.worker import checked_sandbox_id, header_msg_id, run_guarded
from shared.models.messages import PauseSandbox, SandboxFailed, SandboxSnapshotted, msg_id


def build_router(
    snapshotter: Snapshotter, *, retry: RetryPolicy = SNAPSHOTTER_PAUSE.retry, max_workers: int = 8
) -> NatsRouter:
    router = NatsRouter()
    # Documentation only (the handler publishes through the Publisher port for deterministic ids).
    router.publisher(
        subjects.all_of(subjects.EVT_SNAPSHOTTED),
        title="sandbox.evt.snapshotted",
        description="The process snapshot is stored on the workload and in the record.",
        schema=SandboxSnapshotted,
    )
    router.publisher(
        subjects.all_of(subjects.EVT_FAILED),
        title="sandbox.evt.failed",
        description="A transition gave up; the record is in state failed with the reason.",
        schema=SandboxFailed,
    )

    @router.subscriber(  # type: ignore[untyped-decorator]
        **subscriber_args(SNAPSHOTTER_PAUSE, max_workers=max_workers),
        title="sandbox.cmd.pause",
        description="Pause a running sandbox: capture its processes (first half of a pause).",
    )
    async def on_pause(body: PauseSandbox, msg: NatsMessage) -> None:
        sid = checked_sandbox_id(msg, body.sandbox_id)
        cmd_id = header_msg_id(msg, msg_id("pause", sid, body.generation))

        async def fail(reason: str) -> None:
            await snapshotter.give_up(body, cmd_id, reason)

        await run_guarded(lambda: snapshotter.pause(body, cmd_id), msg=msg, retry=retry, fail=fail)

    return router
