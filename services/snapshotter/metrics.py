"""Prometheus metrics of the snapshotter, made on the registry of the process it is given
(``shared.lifecycle.hosting.Context.registry``), never as module globals."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from shared.metrics import Declare

BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class SnapshotterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        new = Declare(registry)
        self.seconds = new.histogram(
            "torpor_snapshot_duration_seconds",
            "Time to capture a sandbox's processes and store the snapshot (the pause's first half)",
            buckets=BUCKETS,
        )
        self.snapshots = new.counter(  # outcome: snapshotted | skipped | failed | retry
            "torpor_snapshots_total",
            "Pause commands handled by the snapshotter, by outcome",
            "outcome",
        )
        self.processes = new.histogram(
            "torpor_snapshot_processes",
            "Processes captured per snapshot",
            buckets=(0, 1, 2, 5, 10, 20, 50, 100, 500),
        )
        self.bytes = new.histogram(
            "torpor_snapshot_bytes",
            "Encoded snapshot annotation size",
            buckets=(256, 1024, 4096, 16384, 65536, 204800),
        )
