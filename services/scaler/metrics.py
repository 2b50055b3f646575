"""Prometheus metrics of the scaler (process-wide, registered once)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120)

DURATION = Histogram(
    "torpor_transition_duration_seconds",
    "Duration of lifecycle transitions done by the scaler. pause: from the pause command taking "
    "the record to paused (snapshot + scale to 0); resume: scale to 1, wait ready, replay; "
    "create: workload creation to ready; kill: delete",
    ["op"],
    buckets=BUCKETS,
)
OUTCOMES = Counter(
    "torpor_transitions_total",
    "Lifecycle transitions finished by the scaler, by operation and outcome",
    ["op", "outcome"],  # outcome: done | failed | skipped
)
REPLAYED = Counter(
    "torpor_replayed_processes_total",
    "Processes restarted from snapshots on resume, by result",
    ["result"],  # ok | error
)


def observe(op: str, outcome: str, seconds: float | None) -> None:
    OUTCOMES.labels(op, outcome).inc()
    if seconds is not None and outcome == "done":
        DURATION.labels(op).observe(seconds)
