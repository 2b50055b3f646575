"""The builder's subscriber: ``sandbox.cmd.template_build.<build id>`` on the durable
``builder-builds``."""

from __future__ import annotations

from datetime import UTC, datetime

from faststream.nats import NatsMessage, NatsRouter

from services.builder.building import Builder
from shared.bus import subjects
from shared.bus.broker import subscriber_args
from shared.bus.retry import PoisonMessage, RetryPolicy
from shared.bus.topology import BUILDER_BUILDS
from shared.lifecycle.worker import run_guarded
from shared.models.template_messages import BuildTemplate
from shared.models.template_records import BuildStatus, FailureReason


def build_router(builder: Builder, *, retry: RetryPolicy, max_workers: int = 2) -> NatsRouter:
    router = NatsRouter()

    @router.subscriber(  # type: ignore[untyped-decorator]
        **subscriber_args(BUILDER_BUILDS, max_workers=max_workers),
        title="sandbox.cmd.template_build",
        description=(
            "Build a template (E2B's template API): run the build's steps on its base in build "
            "pods, cache each layer by content, make the template ready or fail it with the "
            "failing step's log."
        ),
    )
    async def on_build(body: BuildTemplate, msg: NatsMessage) -> None:
        if subjects.sandbox_id_of(msg.raw_message.subject) != body.build_id:
            raise PoisonMessage("subject and body name different builds")

        async def fail(reason: str) -> None:
            failure = FailureReason(message=f"the build failed: {reason}")
            await builder.store.update_build(
                body.build_id,
                lambda r: (
                    r.model_copy(
                        update={
                            "status": BuildStatus.ERROR,
                            "reason": failure,
                            "finished_at": datetime.now(UTC),
                        }
                    )
                    if r.status is BuildStatus.BUILDING
                    else r
                ),
            )

        await run_guarded(lambda: builder.build(body.build_id), msg=msg, retry=retry, fail=fail)

    return router
