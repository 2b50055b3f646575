"""The snapshotter's subscribers: ``sandbox.cmd.pause.<sid>`` on the durable ``snapshotter-pause``;
``sandbox.cmd.snapshot.<sid>`` and ``sandbox.cmd.snapshot_delete.<sid>`` (stored snapshots) on
``snapshotter-snapshots``, dispatched by the subject's verb."""

from __future__ import annotations

from typing import Any

from faststream.nats import NatsMessage, NatsRouter

from services.snapshotter.keeping import SnapshotKeeper
from services.snapshotter.pausing import Snapshotter
from shared.bus import subjects
from shared.bus.broker import EventDoc, document_events, subscriber_args
from shared.bus.retry import PoisonMessage, RetryPolicy
from shared.bus.topology import SNAPSHOTTER_EXPIRY, SNAPSHOTTER_PAUSE, SNAPSHOTTER_SNAPSHOTS
from shared.lifecycle.worker import checked_sandbox_id, header_msg_id, run_guarded
from shared.models.messages import (
    DeleteSnapshot,
    PauseSandbox,
    SandboxFailed,
    SandboxHookRan,
    SandboxSnapshotted,
    SnapshotDeleted,
    SnapshotTaken,
    TakeSnapshot,
    msg_id,
)

_PAUSE_EVENTS: tuple[EventDoc, ...] = (
    (
        subjects.EVT_SNAPSHOTTED,
        SandboxSnapshotted,
        "The process snapshot is stored on the workload and in the record.",
    ),
    (
        subjects.EVT_HOOK,
        SandboxHookRan,
        "A prePause hook ran (outcome.aborted: it refused the pause).",
    ),
    (
        subjects.EVT_FAILED,
        SandboxFailed,
        "A transition gave up; the record is in state failed with the reason.",
    ),
)
_SNAPSHOT_EVENTS: tuple[EventDoc, ...] = (
    (
        subjects.EVT_SNAPSHOT_TAKEN,
        SnapshotTaken,
        "A stored snapshot (process list and files) of the sandbox is ready.",
    ),
    (
        subjects.EVT_SNAPSHOT_DELETED,
        SnapshotDeleted,
        "A stored snapshot taken of the sandbox is deleted (files and record).",
    ),
)


def build_router(
    snapshotter: Snapshotter,
    keeper: SnapshotKeeper | None = None,
    *,
    retry: RetryPolicy = SNAPSHOTTER_PAUSE.retry,
    snapshot_retry: RetryPolicy = SNAPSHOTTER_SNAPSHOTS.retry,
    max_workers: int = 8,
) -> NatsRouter:
    router = NatsRouter()
    document_events(router, _PAUSE_EVENTS)

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

    if keeper is None:
        return router
    document_events(router, _SNAPSHOT_EVENTS)

    @router.subscriber(  # type: ignore[untyped-decorator]
        **subscriber_args(SNAPSHOTTER_SNAPSHOTS, max_workers=max_workers),
        title="sandbox.cmd.{snapshot,snapshot_delete}",
        description=(
            "Stored snapshots, on one durable: sandbox.cmd.snapshot.<sid> (TakeSnapshot: capture "
            "the running sandbox's processes and files; it keeps running), "
            "sandbox.cmd.snapshot_delete.<sid> (DeleteSnapshot). The verb is the subject's "
            "third token."
        ),
    )
    async def on_snapshot_command(body: dict[str, Any], msg: NatsMessage) -> None:
        subject = msg.raw_message.subject
        verb = subjects.verb_of(subject)
        if verb == "snapshot":
            take = TakeSnapshot.model_validate(body)
            checked_sandbox_id(msg, take.sandbox_id)

            async def fail_take(reason: str) -> None:
                await keeper.give_up_take(take, reason)

            await run_guarded(
                lambda: keeper.take(take), msg=msg, retry=snapshot_retry, fail=fail_take
            )
        elif verb == "snapshot_delete":
            delete = DeleteSnapshot.model_validate(body)
            checked_sandbox_id(msg, delete.sandbox_id)
            # A delete keeps being retried (never "failed"): its files must go eventually.
            await keeper.delete(delete)
        else:
            raise PoisonMessage(f"the snapshotter does not handle {subject}")

    @router.subscriber(  # type: ignore[untyped-decorator]
        **subscriber_args(SNAPSHOTTER_EXPIRY, max_workers=max_workers),
        title="sandbox.timer.snapshot_expired",
        description=(
            "A stored snapshot's retention ended (fired by the NATS schedule the snapshotter "
            "armed when it was taken): delete it unless its owner already did."
        ),
    )
    async def on_snapshot_expired(body: DeleteSnapshot, msg: NatsMessage) -> None:
        checked_sandbox_id(msg, body.sandbox_id)
        await keeper.expire(body)

    return router
