"""Composition root of the scaler: ports in, a running worker out."""

from __future__ import annotations

from faststream.nats import NatsRouter

from services.scaler.handlers import build_router
from services.scaler.metrics import ScalerMetrics
from services.scaler.scaling import Scaler
from services.scaler.settings import ScalerSettings
from shared.bus.topology import SCALER_LIFECYCLE
from shared.lifecycle.hosting import Context, Parts, WorkerHost, template_facts, tuned_retry


def scaler_host(ctx: Context, settings: ScalerSettings) -> WorkerHost:
    runtime, envd = ctx.pods()
    templates = template_facts()
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
            templates=templates,
            metrics=metrics,
        )
        retry = tuned_retry(SCALER_LIFECYCLE, settings)
        return build_router(scaler, retry=retry, max_workers=settings.max_workers)

    return WorkerHost(service="scaler", bus=ctx.bus, build=build)
