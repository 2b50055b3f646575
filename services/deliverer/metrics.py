"""Prometheus metrics of the deliverer (served on ``/metrics`` by ``shared.health``), made on the
registry of the process it is given (``shared.lifecycle.hosting.Context.registry``), never as
module globals."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from shared.metrics import Declare


class DelivererMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        new = Declare(registry)
        self.fanned_out = new.counter(
            "torpor_webhook_jobs_total", "Delivery jobs made from lifecycle events (deduplicated)"
        )
        self.attempts = new.counter(
            "torpor_webhook_attempts_total",
            "Delivery attempts, by outcome (delivered, retrying, dead_lettered, dropped, refused)",
            "outcome",
        )
        self.attempt_seconds = new.histogram(
            "torpor_webhook_attempt_seconds",
            "Duration of one delivery attempt (resolve, connect, status line)",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
