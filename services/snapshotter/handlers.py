"""The snapshotter's subscriber: ``sandbox.cmd.pause.<sid>`` on the durable
``snapshotter-pause``."""

from __future__ import annotations

from faststream.nats import NatsMessage, NatsRouter

from services.snapshotter.pausing import Snapshotter
from shared.bus import subjects
from shared.bus.broker import subscriber_args
from shared.bus.middleware import PoisonMessage
from shared.bus.topology import SNAPSHOTTER_PAUSE
from shared.lifecycle.worker import guarded, header_msg_id, heartbeat
from shared.models.messages import PauseSandbox, SandboxFailed, SandboxSnapshotted, msg_id

HEARTBEAT_EVERY = SNAPSHOTTER_PAUSE.backoff[0] / 3


def build_router(
    snapshotter: Snapshotter,
    *,
    give_up_after: int,
    max_workers: int = 8,
    heartbeat_every: float = HEARTBEAT_EVERY,
) -> NatsRouter:
    router = NatsRouter()
    # Documentation only (the handler publishes through ``BrokerPublisher`` for deterministic ids).
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
        if subjects.sandbox_id_of(msg.raw_message.subject) != body.sandbox_id:
            raise PoisonMessage("subject and body name different sandboxes")
        cmd_id = header_msg_id(msg, msg_id("pause", body.sandbox_id, body.generation))

        async def fail(reason: str) -> None:
            await snapshotter.give_up(body, cmd_id, reason)

        async with heartbeat(msg, every=heartbeat_every):
            await guarded(
                lambda: snapshotter.pause(body, cmd_id),
                msg=msg,
                give_up_after=give_up_after,
                fail=fail,
            )

    return router
