"""Composition root of the snapshotter: ports in, a running worker out."""

from __future__ import annotations

from faststream.nats import NatsRouter

from services.snapshotter.handlers import build_router
from services.snapshotter.keeping import SnapshotKeeper
from services.snapshotter.metrics import SnapshotterMetrics
from services.snapshotter.pausing import Snapshotter
from services.snapshotter.settings import SnapshotterSettings
from shared.bus.broker import key_value
from shared.bus.snapshot_store import KvSnapshotStore
from shared.bus.snapshot_timers import NatsSnapshotTimers
from shared.bus.topology import KV_SNAPSHOTS, SNAPSHOTTER_PAUSE, SNAPSHOTTER_SNAPSHOTS
from shared.lifecycle.hosting import Context, Parts, WorkerHost, template_facts, tuned_retry


def snapshotter_host(ctx: Context, settings: SnapshotterSettings) -> WorkerHost:
    runtime, envd = ctx.pods()
    templates = template_facts()
    metrics = SnapshotterMetrics(ctx.registry)  # once per host: its builds share it

    def build(parts: Parts) -> NatsRouter:
        snapshotter = Snapshotter(
            store=parts.store,
            runtime=runtime,
            envd=envd,
            publisher=parts.publisher,
            envd_timeout=settings.envd_timeout,
            templates=templates,
            hold=settings.pause_hold_seconds,
            metrics=metrics,
        )
        keeper = SnapshotKeeper(
            sandboxes=parts.store,
            snapshots=KvSnapshotStore(lambda: key_value(parts.broker, KV_SNAPSHOTS)),
            runtime=runtime,
            envd=envd,
            publisher=parts.publisher,
            timers=NatsSnapshotTimers(lambda: parts.broker.config.connection_state.stream),
            envd_timeout=settings.envd_timeout,
        )
        return build_router(
            snapshotter,
            keeper,
            retry=tuned_retry(SNAPSHOTTER_PAUSE, settings),
            snapshot_retry=tuned_retry(SNAPSHOTTER_SNAPSHOTS, settings),
            max_workers=settings.max_workers,
        )

    return WorkerHost(service="snapshotter", bus=ctx.bus, build=build)
