"""The scheduler's configuration (environment, read once in ``main``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.settings import FeatureFlags, load

DAY = 86400


class TimerSettings(BaseSettings):
    """``TORPOR_RETENTION_SECONDS`` and the pause-retry policy (``services.scheduler.expiry``)."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", env_prefix="TORPOR_")

    # Paused sandboxes are deleted this long after they were paused.
    retention_seconds: int = Field(default=30 * DAY, ge=1)
    # How long a timeout pause may take before the scheduler looks again; doubles per attempt.
    pause_check_seconds: float = Field(default=30.0, gt=0)
    # Pause attempts before the scheduler gives up and deletes the sandbox instead.
    pause_attempts: int = Field(default=4, ge=1)
    # Fired timer messages delete themselves after this (``Nats-Schedule-TTL``).
    fired_ttl: str = "1h"
    # Concurrent handlers per durable, and messages fetched per pull request.
    max_workers: int = Field(default=16, ge=1)
    fetch_batch: int = Field(default=64, ge=1, le=256)
    fetch_wait_seconds: float = Field(default=0.25, gt=0, le=30)


class SchedulerSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    flags: FeatureFlags
    timers: TimerSettings


def load_settings() -> SchedulerSettings:
    return SchedulerSettings(flags=load(FeatureFlags), timers=load(TimerSettings))
