"""Prometheus metrics of the scaler, made on the registry of the process it is given
(``shared.lifecycle.hosting.Context.registry``), never as module globals."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from shared.metrics import Declare

BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120)


class ScalerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        new = Declare(registry)
        self.duration = new.histogram(
            "torpor_transition_duration_seconds",
            "Duration of lifecycle transitions done by the scaler. pause: from the pause command "
            "taking the record to paused (snapshot + scale to 0); resume: scale to 1, wait ready, "
            "replay; create: workload creation to ready; kill: delete",
            "op",
            buckets=BUCKETS,
        )
        self.outcomes = new.counter(  # outcome: done | failed | skipped
            "torpor_transitions_total",
            "Lifecycle transitions finished by the scaler, by operation and outcome",
            "op",
            "outcome",
        )
        self.replayed = new.counter(  # result: ok | error
            "torpor_replayed_processes_total",
            "Processes restarted from snapshots on resume, by result",
            "result",
        )

    def observe(self, op: str, outcome: str, seconds: float | None) -> None:
        self.outcomes.labels(op, outcome).inc()
        if seconds is not None and outcome == "done":
            self.duration.labels(op).observe(seconds)
