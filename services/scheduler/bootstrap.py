"""Composition root of the scheduler: the timers adapter and the handlers in, a worker out.

Every replica binds the same two durables (``scheduler-lifecycle`` on SANDBOX_EVT,
``scheduler-fired`` on SANDBOX_TIMERS); the server hands each message to one replica.
"""

from __future__ import annotations

from datetime import timedelta

from faststream.nats import NatsRouter

from services.scheduler import expiry
from services.scheduler.handlers import SchedulerHandlers, build_router
from services.scheduler.settings import SchedulerSettings
from services.scheduler.timers import NatsTimers
from shared.lifecycle.hosting import Context, Parts, WorkerHost


def policy_of(settings: SchedulerSettings) -> expiry.Policy:
    t = settings.timers
    return expiry.Policy(
        retention=timedelta(seconds=t.retention_seconds),
        pause_check=timedelta(seconds=t.pause_check_seconds),
        pause_attempts=t.pause_attempts,
    )


def scheduler_host(ctx: Context, settings: SchedulerSettings) -> WorkerHost:
    def build(parts: Parts) -> NatsRouter:
        t = settings.timers
        handlers = SchedulerHandlers(
            store=parts.store,
            publisher=parts.publisher,
            timers=NatsTimers(parts.broker.config.connection_state.stream, fired_ttl=t.fired_ttl),
            flags=settings.flags,
            policy=policy_of(settings),
        )
        return build_router(
            handlers,
            max_workers=t.max_workers,
            fetch_batch=t.fetch_batch,
            fetch_wait=t.fetch_wait_seconds,
        )

    return WorkerHost(service="scheduler", bus=ctx.bus, build=build)
