"""Snapshotter settings (environment, ``TORPOR_`` prefix). Bus, runtime, logging and health
settings are the shared ones (``shared.settings``, ``shared.health``)."""

from __future__ import annotations

from pydantic import Field

from shared.settings import _Base


class SnapshotterSettings(_Base):
    # Deliveries of one pause command before the pause is failed on the record (daemon down, ...).
    give_up_after: int = Field(default=5, ge=1, le=10)  # TORPOR_GIVE_UP_AFTER
    envd_timeout: float = Field(default=10.0, gt=0)  # TORPOR_ENVD_TIMEOUT: one List call
    # TORPOR_HEARTBEAT_SECONDS: in_progress() interval of long handlers; below the ack_wait (30 s)
    heartbeat_seconds: float = Field(default=10.0, gt=0)
    max_workers: int = Field(default=8, ge=1)  # TORPOR_MAX_WORKERS: concurrent pauses per replica
