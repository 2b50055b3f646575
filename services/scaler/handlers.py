"""The scaler's subscribers.

- ``scaler-lifecycle`` (SANDBOX_CMD): ``sandbox.cmd.create.*``, ``sandbox.cmd.resume.*``,
  ``sandbox.cmd.kill.*`` and ``sandbox.cmd.network.*`` on one durable (work-queue filters must
  not overlap), dispatched by the subject's verb.
- ``scaler-on-snapshotted`` (SANDBOX_EVT): ``sandbox.evt.snapshotted.*`` → scale to 0.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

import structlog
from faststream.nats import NatsMessage, NatsRouter

from services.scaler.scaling import Scaler
from shared.bus import subjects
from shared.bus.broker import EventDoc, document_events, subscriber_args
from shared.bus.retry import PoisonMessage, RetryPolicy
from shared.bus.topology import SCALER_LIFECYCLE, SCALER_ON_SNAPSHOTTED
from shared.lifecycle.worker import (
    FailFn,
    SandboxLocks,
    checked_sandbox_id,
    header_msg_id,
    run_guarded,
)
from shared.models.messages import (
    CreateSandbox,
    KillSandbox,
    ResumeSandbox,
    SandboxCreated,
    SandboxFailed,
    SandboxHookRan,
    SandboxKilled,
    SandboxPaused,
    SandboxResumed,
    SandboxSnapshotted,
    SetSandboxNetwork,
    msg_id,
)

log = structlog.get_logger()

_EVENTS: tuple[EventDoc, ...] = (
    (subjects.EVT_CREATED, SandboxCreated, "The sandbox's first pod is ready; it is running."),
    (subjects.EVT_PAUSED, SandboxPaused, "The workload is at 0 replicas with its snapshot stored."),
    (subjects.EVT_RESUMED, SandboxResumed, "Running again; per-process replay outcomes."),
    (subjects.EVT_KILLED, SandboxKilled, "The workload is deleted; the record is a tombstone."),
    (
        subjects.EVT_HOOK,
        SandboxHookRan,
        "A postResume or preKill hook ran (postResume with outcome.aborted: the resume failed).",
    ),
    (
        subjects.EVT_FAILED,
        SandboxFailed,
        "A transition gave up; the record is failed with a reason.",
    ),
)


def _queued_ms(msg: NatsMessage) -> float | None:
    """From the command's storage in the stream to its handler (same host: one clock)."""
    try:
        stored = msg.raw_message.metadata.timestamp
    except Exception:
        return None
    return round((datetime.now(UTC) - stored).total_seconds() * 1000, 1)


def build_router(
    scaler: Scaler, *, retry: RetryPolicy = SCALER_LIFECYCLE.retry, max_workers: int = 8
) -> NatsRouter:
    router = NatsRouter()
    locks = SandboxLocks()

    async def run(
        msg: NatsMessage, sid: str, work: Callable[[], Awaitable[Any]], fail: FailFn
    ) -> None:
        await run_guarded(work, msg=msg, retry=retry, fail=fail, lock=locks.hold(sid))

    document_events(router, _EVENTS)

    @router.subscriber(  # type: ignore[untyped-decorator]
        **subscriber_args(SCALER_LIFECYCLE, max_workers=max_workers),
        title="sandbox.cmd.{create,resume,kill,network}",
        description=(
            "Commands owned by the scaler, on one durable: sandbox.cmd.create.<sid> "
            "(CreateSandbox), sandbox.cmd.resume.<sid> (ResumeSandbox), sandbox.cmd.kill.<sid> "
            "(KillSandbox), sandbox.cmd.network.<sid> (SetSandboxNetwork: apply the record's "
            "network policy). The verb is the subject's third token."
        ),
    )
    async def on_command(body: dict[str, Any], msg: NatsMessage) -> None:
        subject = msg.raw_message.subject
        verb = subjects.verb_of(subject)
        if verb == "create":
            create = CreateSandbox.model_validate(body)
            sid = checked_sandbox_id(msg, create.sandbox_id)
            structlog.contextvars.bind_contextvars(queued_ms=_queued_ms(msg))
            cmd_id = header_msg_id(msg, msg_id("create", sid, 0))
            fail = partial(scaler.give_up, "create", sid, cmd_msg_id=cmd_id)
            await run(msg, sid, lambda: scaler.create(create, cmd_id), fail)
        elif verb == "resume":
            resume = ResumeSandbox.model_validate(body)
            sid = checked_sandbox_id(msg, resume.sandbox_id)
            structlog.contextvars.bind_contextvars(queued_ms=_queued_ms(msg))
            cmd_id = header_msg_id(msg, msg_id("resume", sid, resume.generation))
            fail = partial(scaler.give_up, "resume", sid, cmd_msg_id=cmd_id)
            await run(msg, sid, lambda: scaler.resume(resume, cmd_id, msg.in_progress), fail)
        elif verb == "kill":
            kill = KillSandbox.model_validate(body)
            sid = checked_sandbox_id(msg, kill.sandbox_id)
            cmd_id = header_msg_id(msg, msg_id("kill", sid, kill.generation))
            fail = partial(scaler.give_up, "kill", sid, cmd_msg_id=cmd_id)
            await run(msg, sid, lambda: scaler.kill(kill, cmd_id), fail)
        elif verb == "network":
            network = SetSandboxNetwork.model_validate(body)
            sid = checked_sandbox_id(msg, network.sandbox_id)

            async def fail_network(reason: str) -> None:
                # The sandbox keeps running with its previous policy: say so loudly.
                log.error("network_apply_gave_up", sandbox_id=sid, reason=reason)

            await run(msg, sid, lambda: scaler.apply_network(network), fail_network)
        else:
            raise PoisonMessage(f"the scaler does not handle {subject}")

    @router.subscriber(  # type: ignore[untyped-decorator]
        **subscriber_args(SCALER_ON_SNAPSHOTTED, max_workers=max_workers),
        title="sandbox.evt.snapshotted (scaler)",
        description="Second half of a pause: check the stored snapshot, scale to 0, mark paused.",
    )
    async def on_snapshotted(body: SandboxSnapshotted, msg: NatsMessage) -> None:
        sid = checked_sandbox_id(msg, body.sandbox_id)
        fail = partial(scaler.give_up, "pause", sid, generation=body.generation)
        await run(msg, sid, lambda: scaler.finish_pause(body, msg.in_progress), fail)

    return router
