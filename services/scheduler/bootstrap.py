"""Composition root of the scheduler: the timers adapter and the handlers in, a worker out.

Every replica binds the same two durables (``scheduler-lifecycle`` on SANDBOX_EVT,
``scheduler-fired`` on SANDBOX_TIMERS) and pulls them in batches (``shared.bus.batches``); the
server hands each message to one replica, and a dead replica's unacked messages to another.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial

from faststream.nats import NatsRouter

from services.scheduler import plans
from services.scheduler.handlers import SchedulerHandlers
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.settings import SchedulerSettings
from shared.bus.batches import BatchConsumer
from shared.bus.records import bucket_version
from shared.bus.timers import NatsTimers
from shared.bus.topology import KV_SANDBOXES, SCHEDULER_FIRED, SCHEDULER_LIFECYCLE
from shared.envd.client import ConnectEnvdClient
from shared.lifecycle.hosting import Built, Context, Parts, WorkerHost
from shared.runtime.template_facts import read_facts
from shared.settings import RetentionSettings, RuntimeSettings, load


def policy_of(settings: SchedulerSettings, retention: RetentionSettings) -> plans.Policy:
    return plans.Policy(
        retention=retention.retention,
        pause_check=timedelta(seconds=settings.pause_check_seconds),
        pause_attempts=settings.pause_attempts,
    )


def scheduler_host(ctx: Context, settings: SchedulerSettings) -> WorkerHost:
    # Templates say what activity inside a sandbox counts; its daemon says when it was active.
    where = load(RuntimeSettings)

    lead = timedelta(seconds=settings.fire_lead_seconds)
    metrics = SchedulerMetrics(ctx.registry)  # once per host: its builds share it

    def build(parts: Parts) -> Built:
        js = parts.broker.config.connection_state.stream
        handlers = SchedulerHandlers(
            store=parts.store,
            publisher=parts.publisher,
            timers=NatsTimers(js, fired_ttl=settings.fired_ttl, lead=lead),
            flags=ctx.flags,
            policy=policy_of(settings, ctx.retention),
            templates=partial(read_facts, where.runtime, where.templates_dir),
            envd=ConnectEnvdClient(),
            records_version=partial(bucket_version, js, KV_SANDBOXES),
            lead=lead,
            metrics=metrics,
        )
        pull = partial(
            BatchConsumer,
            js,
            batch=settings.fetch_batch,
            wait=settings.fetch_wait_seconds,
            inflight=settings.max_workers,
        )
        return Built(
            NatsRouter(),  # no FastStream subscriber: both durables are pulled in batches
            (
                pull(SCHEDULER_LIFECYCLE, handlers.on_event_batch),
                pull(SCHEDULER_FIRED, handlers.on_fired_batch, inflight=settings.fired_in_flight),
            ),
        )

    return WorkerHost(service="scheduler", bus=ctx.bus, build=build)
