"""Scaler settings (environment, ``TORPOR_`` prefix)."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field

from shared.settings import _Base

DAY = 86400


class ScalerSettings(_Base):
    # Paused sandboxes are kept this long, then deleted (TORPOR_RETENTION_SECONDS, 30 days).
    retention_seconds: int = Field(default=30 * DAY, ge=60)
    # Killed sandboxes stay in KV as tombstones this long (TORPOR_TOMBSTONE_SECONDS).
    tombstone_seconds: int = Field(default=DAY, ge=0)
    ready_timeout: float = Field(default=60.0, gt=0)  # TORPOR_READY_TIMEOUT: new pod Ready
    stop_timeout: float = Field(default=60.0, gt=0)  # TORPOR_STOP_TIMEOUT: pod gone after scale 0
    start_timeout: float = Field(default=10.0, gt=0)  # TORPOR_START_TIMEOUT: one replayed Start
    give_up_after: int = Field(default=5, ge=1, le=10)  # TORPOR_GIVE_UP_AFTER deliveries
    # TORPOR_HEARTBEAT_SECONDS: in_progress() interval of long handlers; below the ack_wait (30 s)
    heartbeat_seconds: float = Field(default=10.0, gt=0)
    max_workers: int = Field(default=8, ge=1)  # TORPOR_MAX_WORKERS per subscriber per replica

    @property
    def retention(self) -> timedelta:
        return timedelta(seconds=self.retention_seconds)

    @property
    def tombstone_for(self) -> timedelta:
        return timedelta(seconds=self.tombstone_seconds)
