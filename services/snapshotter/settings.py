"""The snapshotter's own settings (``TORPOR_SNAPSHOTTER_*``). Bus, runtime, logging and health
are the shared sections (``shared.settings``)."""

from __future__ import annotations

from shared.settings import SettingsBase, constant, prefixed


class SnapshotterSettings(SettingsBase):
    model_config = prefixed("snapshotter")

    give_up_after: int = constant(5, ge=1, le=10)
    """Deliveries of one pause command before the pause is failed on the record (the pod keeps
    running). At 8 or more the command is dead-lettered first (``shared/bus/retry.py``)."""
    envd_timeout: float = constant(10.0, gt=0)
    """Seconds for one envd ``List`` call."""
    heartbeat_seconds: float = constant(10.0, gt=0)
    """``in_progress()`` interval of long handlers; below the durable's ``ack_wait`` (30 s)."""
    max_workers: int = constant(8, ge=1)
    """Concurrent pauses per replica."""
    pause_hold_seconds: float = constant(120.0, ge=0, le=600)
    """Seconds a pause keeps the sandbox's processes stopped after exporting its kept files
    (Kubernetes ``persist: store``), for the scaler to stop the pod: nothing is written after
    the copy. If the pod still runs then (the scaler is slow or the pause failed), its
    processes continue and later writes are lost at its stop; 0 stops them only for the
    export. A pause that fails continues them at once."""
