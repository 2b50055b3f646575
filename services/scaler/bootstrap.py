"""Composition root of the scaler: ports in, a running worker out."""

from __future__ import annotations

from functools import partial

from faststream.nats import NatsRouter

from services.scaler.handlers import build_router
from services.scaler.metrics import ScalerMetrics
from services.scaler.scaling import Scaler
from services.scaler.settings import ScalerSettings
from shared.bus.topology import SCALER_LIFECYCLE
from shared.lifecycle.hosting import Context, Parts, WorkerHost
from shared.runtime.template_facts import read_facts
from shared.settings import RuntimeSettings, load


def scaler_host(ctx: Context, settings: ScalerSettings) -> WorkerHost:
    runtime, envd = ctx.pods()
    where = load(RuntimeSettings)  # already read (and checked) for the runtime itself
    metrics = ScalerMetrics(ctx.registry)  # once per host: its builds share it

    def build(parts: Parts) -> NatsRouter:
        scaler = Scaler(
            store=parts.store,
            runtime=runtime,
            envd=envd,
            publisher=parts.publisher,
            ready_timeout=settings.ready_timeout,
            stop_timeout=settings.stop_timeout,
            start_timeout=settings.start_timeout,
            retention=ctx.retention.retention,
            tombstone_for=ctx.retention.tombstone_for,
            templates=partial(read_facts, where.runtime, where.templates_dir),
            metrics=metrics,
        )
        retry = SCALER_LIFECYCLE.retry.tuned(
            give_up_after=settings.give_up_after, heartbeat=settings.heartbeat_seconds
        )
        return build_router(scaler, retry=retry, max_workers=settings.max_workers)

    return WorkerHost(service="scaler", bus=ctx.bus, build=build)
