"""Prometheus metrics of the scheduler (served on ``/metrics`` by ``shared.health``), made on the
registry of the process it is given (``shared.lifecycle.hosting.Context.registry``), never as
module globals: two schedulers in one process (the tests') count apart."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.fired = Counter(
            "torpor_scheduler_timers_fired_total",
            "Fired timers handled, by kind and outcome",
            ["kind", "outcome"],
            registry=registry,
        )
        self.events = Counter(
            "torpor_scheduler_events_total",
            "Lifecycle events handled, by event and outcome",
            ["event", "outcome"],
            registry=registry,
        )
        self.expiries = Counter(
            "torpor_scheduler_expiries_total",
            "Expiry decisions published, by decision",
            ["decision"],
            registry=registry,
        )
        self.retention_kills = Counter(
            "torpor_scheduler_retention_kills_total", "Paused sandboxes deleted", registry=registry
        )
        self.armed = Counter(
            "torpor_scheduler_timers_armed_total",
            "Schedules published, by kind",
            ["kind"],
            registry=registry,
        )
        self.cancelled = Counter(
            "torpor_scheduler_timers_cancelled_total",
            "Schedules purged, by holder",
            ["holder"],
            registry=registry,
        )
        self.lateness = Histogram(
            "torpor_scheduler_expiry_lateness_seconds",
            "Decision time minus the deadline that expired",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
            registry=registry,
        )
