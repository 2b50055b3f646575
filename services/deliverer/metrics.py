"""Prometheus metrics of the deliverer (served on ``/metrics`` by ``shared.health``)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

FANNED_OUT = Counter(
    "torpor_webhook_jobs_total", "Delivery jobs made from lifecycle events (deduplicated)"
)
ATTEMPTS = Counter(
    "torpor_webhook_attempts_total",
    "Delivery attempts, by outcome (delivered, retrying, dead_lettered, dropped, refused)",
    ["outcome"],
)
ATTEMPT_SECONDS = Histogram(
    "torpor_webhook_attempt_seconds",
    "Duration of one delivery attempt (resolve, connect, status line)",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
