"""Prometheus series of the ledger: each user's usage as of their last event (open intervals are
added when read through the API, not here). Made on the registry of the process it is given
(``shared.lifecycle.hosting.Context.registry``), never as module globals."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from shared.metrics import Declare
from shared.models.usage import UsageTotals

_SERIES = {
    "running_seconds": ("torpor_usage_running_seconds", "Running seconds of the user's sandboxes"),
    "paused_seconds": ("torpor_usage_paused_seconds", "Paused seconds of the user's sandboxes"),
    "cpu_seconds": ("torpor_usage_cpu_seconds", "Running seconds x cores"),
    "memory_mb_seconds": ("torpor_usage_memory_mb_seconds", "Running seconds x memory (MiB)"),
    "kept_byte_seconds": ("torpor_usage_kept_byte_seconds", "Paused seconds x bytes kept"),
    "resumes": ("torpor_usage_resumes", "Resumes of the user's sandboxes"),
    "replay_failures": ("torpor_usage_replay_failures", "Processes that failed to replay"),
}


class LedgerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        new = Declare(registry)
        self.applied = new.counter(
            "torpor_usage_events_total",
            "Lifecycle events read by the ledger, by outcome",
            "outcome",
        )
        self._gauges = {
            field: new.gauge(name, doc, "user") for field, (name, doc) in _SERIES.items()
        }

    def publish(self, user: str, figures: UsageTotals) -> None:
        for field, gauge in self._gauges.items():
            gauge.labels(user).set(float(getattr(figures, field)))
