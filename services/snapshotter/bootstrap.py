"""Composition root of the snapshotter: ports in, a running worker out."""

from __future__ import annotations

from faststream.nats import NatsRouter

from services.snapshotter.handlers import build_router
from services.snapshotter.pausing import Snapshotter
from services.snapshotter.settings import SnapshotterSettings
from shared.envd.ports import Envd
from shared.lifecycle.hosting import Parts, WorkerHost
from shared.runtime.ports import Runtime
from shared.settings import BusSettings


def snapshotter_host(
    *, bus: BusSettings, settings: SnapshotterSettings, runtime: Runtime, envd: Envd
) -> WorkerHost:
    def build(parts: Parts) -> NatsRouter:
        snapshotter = Snapshotter(
            store=parts.store,
            runtime=runtime,
            envd=envd,
            publisher=parts.publisher,
            envd_timeout=settings.envd_timeout,
        )
        return build_router(
            snapshotter,
            give_up_after=settings.give_up_after,
            max_workers=settings.max_workers,
            heartbeat_every=settings.heartbeat_seconds,
        )

    return WorkerHost(service="snapshotter", bus=bus, build=build)
