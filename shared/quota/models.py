"""Quota settings (``TORPOR_QUOTA_*``) and the effective quota of a user (the defaults with the
user's override, ``shared.models.quota``, on top). 0 means unlimited."""

from __future__ import annotations

from pydantic import Field

from shared.models.quota import Quota, QuotaOverride
from shared.settings import SettingsBase, constant, prefixed


class QuotaSettings(SettingsBase):
    model_config = prefixed("quota")

    max_sandboxes: int = Field(default=100, ge=0)
    """Sandboxes a user holds, running and paused together."""
    max_running: int = Field(default=50, ge=0)
    """Sandboxes a user has creating, running, resuming or pausing."""
    creates_per_minute: float = Field(default=60.0, ge=0)
    """Create rate (token bucket: the steady rate and how many at once)."""
    create_burst: int = constant(30, ge=1)
    """Create rate (token bucket: the steady rate and how many at once)."""
    resumes_per_minute: float = Field(default=120.0, ge=0)
    """Resume rate (API resume/connect, dashboard, proxy auto-resume)."""
    resume_burst: int = constant(60, ge=1)
    """Resume rate (API resume/connect, dashboard, proxy auto-resume)."""
    max_snapshots: int = Field(default=100, ge=0)
    """Stored snapshots a user holds (`create_snapshot`; fork's own are not counted)."""


def effective(defaults: QuotaSettings, override: QuotaOverride | None) -> Quota:
    values = {name: getattr(defaults, name) for name in Quota.model_fields}
    if override is not None:
        values.update({k: v for k, v in override.model_dump().items() if v is not None})
    return Quota(**values)
