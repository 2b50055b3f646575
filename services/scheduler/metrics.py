"""Prometheus metrics of the scheduler (served on ``/metrics`` by ``shared.health``), made on the
registry of the process it is given (``shared.lifecycle.hosting.Context.registry``), never as
module globals: two schedulers in one process (the tests') count apart."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from shared.metrics import Declare


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        new = Declare(registry)
        self.fired = new.counter(
            "torpor_scheduler_timers_fired_total",
            "Fired timers handled, by kind and outcome",
            "kind",
            "outcome",
        )
        self.events = new.counter(
            "torpor_scheduler_events_total",
            "Lifecycle events handled, by event and outcome",
            "event",
            "outcome",
        )
        self.expiries = new.counter(
            "torpor_scheduler_expiries_total", "Expiry decisions published, by decision", "decision"
        )
        self.retention_kills = new.counter(
            "torpor_scheduler_retention_kills_total", "Paused sandboxes deleted"
        )
        self.armed = new.counter(
            "torpor_scheduler_timers_armed_total", "Schedules published, by kind", "kind"
        )
        self.cancelled = new.counter(
            "torpor_scheduler_timers_cancelled_total", "Schedules purged, by holder", "holder"
        )
        self.lateness = new.histogram(
            "torpor_scheduler_expiry_lateness_seconds",
            "Decision time minus the deadline that expired",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
        )
