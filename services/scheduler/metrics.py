"""Prometheus metrics of the scheduler (served on ``/metrics`` by ``shared.health``)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

FIRED = Counter(
    "torpor_scheduler_timers_fired_total",
    "Fired timers handled, by kind and outcome",
    ["kind", "outcome"],
)
EVENTS = Counter(
    "torpor_scheduler_events_total",
    "Lifecycle events handled, by event and outcome",
    ["event", "outcome"],
)
EXPIRIES = Counter(
    "torpor_scheduler_expiries_total", "Expiry decisions published, by decision", ["decision"]
)
RETENTION_KILLS = Counter("torpor_scheduler_retention_kills_total", "Paused sandboxes deleted")
ARMED = Counter("torpor_scheduler_timers_armed_total", "Schedules published, by kind", ["kind"])
CANCELLED = Counter(
    "torpor_scheduler_timers_cancelled_total", "Schedules purged, by holder", ["holder"]
)
LATENESS = Histogram(
    "torpor_scheduler_expiry_lateness_seconds",
    "Decision time minus the deadline that expired",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
)
