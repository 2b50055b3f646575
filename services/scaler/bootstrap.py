"""Composition root of the scaler: ports in, a running worker out."""

from __future__ import annotations

from faststream.nats import NatsRouter

from services.scaler.handlers import build_router
from services.scaler.scaling import Scaler
from services.scaler.settings import ScalerSettings
from shared.envd.ports import Envd
from shared.lifecycle.hosting import Parts, WorkerHost
from shared.runtime.ports import Runtime
from shared.settings import BusSettings


def scaler_host(
    *, bus: BusSettings, settings: ScalerSettings, runtime: Runtime, envd: Envd
) -> WorkerHost:
    def build(parts: Parts) -> NatsRouter:
        scaler = Scaler(
            store=parts.store,
            runtime=runtime,
            envd=envd,
            publisher=parts.publisher,
            ready_timeout=settings.ready_timeout,
            stop_timeout=settings.stop_timeout,
            start_timeout=settings.start_timeout,
            retention=settings.retention,
            tombstone_for=settings.tombstone_for,
        )
        return build_router(
            scaler,
            give_up_after=settings.give_up_after,
            max_workers=settings.max_workers,
            heartbeat_every=settings.heartbeat_seconds,
        )

    return WorkerHost(service="scaler", bus=bus, build=build)
