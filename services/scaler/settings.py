"""The scaler's own settings (``TORPOR_SCALER_*``). Bus, runtime, logging, health and retention
are the shared sections (``shared.settings``)."""

from __future__ import annotations

from pydantic import Field

from shared.settings import SettingsBase, constant, formerly, prefixed


class ScalerSettings(SettingsBase):
    model_config = prefixed("scaler")

    ready_timeout: float = Field(
        default=60.0,
        gt=0,
        validation_alias=formerly("ready_timeout", service="scaler", old="TORPOR_READY_TIMEOUT"),
    )
    """Seconds for a new pod to become ready (create, resume)."""
    stop_timeout: float = constant(60.0, gt=0)
    """Seconds for the pod to be gone after a scale to 0."""
    start_timeout: float = constant(10.0, gt=0)
    """Seconds for one replayed process ``Start``."""
    give_up_after: int = constant(5, ge=1, le=10)
    """Deliveries of one command before its transition is failed on the record. At 8 or more
    the command is dead-lettered first (``shared/bus/retry.py``)."""
    heartbeat_seconds: float = constant(10.0, gt=0)
    """``in_progress()`` interval of long handlers; below the durables' ``ack_wait`` (30 s)."""
    max_workers: int = constant(8, ge=1)
    """Concurrent messages per subscriber per replica."""
