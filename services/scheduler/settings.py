"""The scheduler's own settings (``TORPOR_SCHEDULER_*``): the pause-retry policy
(``services.scheduler.expiry``) and how it consumes. Retention, feature flags, bus, logging and
health are the shared sections (``shared.settings``)."""

from __future__ import annotations

from shared.settings import SettingsBase, constant, prefixed


class SchedulerSettings(SettingsBase):
    model_config = prefixed("scheduler")

    pause_check_seconds: float = constant(30.0, gt=0)
    """How long a timeout pause may take before the scheduler looks again; doubles per attempt."""
    pause_attempts: int = constant(4, ge=1)
    """Timeout pause attempts before the sandbox is deleted instead."""
    fired_ttl: str = constant("1h")
    """Fired timer messages delete themselves after this (``Nats-Schedule-TTL``)."""
    max_workers: int = constant(2, ge=1, le=16)
    """Batches handled at once per durable (a batch's messages are handled concurrently)."""
    fetch_batch: int = constant(500, ge=1, le=1000)
    """Messages fetched per pull request, handled as one batch."""
    fetch_wait_seconds: float = constant(0.25, gt=0, le=30)
    """Longest wait of an idle pull (bounds the extra latency of a lone fired timer)."""
    fire_lead_seconds: float = constant(2.0, ge=0, le=10)
    """How early a timer's NATS schedule fires; the scheduler holds such a fire until the timer is
    due (nats-server fires up to ~0.5 s late: its schedule timer runs at most every 250 ms)."""
    fired_in_flight: int = constant(16, ge=1, le=64)
    """Fired-timer batches handled at once per replica (a batch holds its early fires until they
    are due, so more are in flight than `max_workers`)."""
