"""``faststream docs gen services.snapshotter.asyncapi:app --factory``."""

from __future__ import annotations

from typing import Any

from faststream import FastStream

from services.snapshotter.handlers import build_router
from services.snapshotter.keeping import SnapshotKeeper
from services.snapshotter.pausing import Snapshotter
from shared.bus.asyncapi import document


def app() -> FastStream:
    inert: Any = None
    router = build_router(
        Snapshotter(store=inert, runtime=inert, envd=inert, publisher=inert),
        SnapshotKeeper(
            sandboxes=inert, snapshots=inert, runtime=inert, envd=inert, publisher=inert
        ),
    )
    return document(
        router,
        title="torpor snapshotter",
        description="Captures a sandbox's processes over envd and stores the seed's snapshot "
        "as the workload annotation torpor.dev/snapshot (first half of a pause); takes and deletes "
        "stored snapshots (E2B create_snapshot, fork).",
    )
