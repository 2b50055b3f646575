"""Prometheus metrics of the snapshotter (process-wide, registered once)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

SNAPSHOT_SECONDS = Histogram(
    "torpor_snapshot_duration_seconds",
    "Time to capture a sandbox's processes and store the snapshot (the pause's first half)",
    buckets=BUCKETS,
)
SNAPSHOTS = Counter(
    "torpor_snapshots_total",
    "Pause commands handled by the snapshotter, by outcome",
    ["outcome"],  # snapshotted | skipped | failed | retry
)
SNAPSHOT_PROCESSES = Histogram(
    "torpor_snapshot_processes",
    "Processes captured per snapshot",
    buckets=(0, 1, 2, 5, 10, 20, 50, 100, 500),
)
SNAPSHOT_BYTES = Histogram(
    "torpor_snapshot_bytes",
    "Encoded snapshot annotation size",
    buckets=(256, 1024, 4096, 16384, 65536, 204800),
)
