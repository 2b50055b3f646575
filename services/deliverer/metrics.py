"""Prometheus metrics of the deliverer (served on ``/metrics`` by ``shared.health``), made on the
registry of the process it is given (``shared.lifecycle.hosting.Context.registry``), never as
module globals."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class DelivererMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.fanned_out = Counter(
            "torpor_webhook_jobs_total",
            "Delivery jobs made from lifecycle events (deduplicated)",
            registry=registry,
        )
        self.attempts = Counter(
            "torpor_webhook_attempts_total",
            "Delivery attempts, by outcome (delivered, retrying, dead_lettered, dropped, refused)",
            ["outcome"],
            registry=registry,
        )
        self.attempt_seconds = Histogram(
            "torpor_webhook_attempt_seconds",
            "Duration of one delivery attempt (resolve, connect, status line)",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
