"""Quota settings (``TORPOR_QUOTA_*``), per-user overrides (stored on the user record) and the
effective quota of a user. 0 means unlimited."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from shared.settings import SettingsBase, prefixed

_LIMIT = Field(default=None, ge=0, le=1_000_000)


class QuotaSettings(SettingsBase):
    model_config = prefixed("quota")

    max_sandboxes: int = Field(default=100, ge=0)
    """Sandboxes a user holds, running and paused together."""
    max_running: int = Field(default=50, ge=0)
    """Sandboxes a user has creating, running, resuming or pausing."""
    creates_per_minute: float = Field(default=60.0, ge=0)
    """Create rate (token bucket: the steady rate and how many at once)."""
    create_burst: int = Field(default=30, ge=1)
    """Create rate (token bucket: the steady rate and how many at once)."""
    resumes_per_minute: float = Field(default=120.0, ge=0)
    """Resume rate (API resume/connect, dashboard, proxy auto-resume)."""
    resume_burst: int = Field(default=60, ge=1)
    """Resume rate (API resume/connect, dashboard, proxy auto-resume)."""
    max_snapshots: int = Field(default=100, ge=0)
    """Stored snapshots a user holds (`create_snapshot`; fork's own are not counted)."""


class QuotaOverride(BaseModel):
    """A user's own limits; ``None`` keeps the default."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    max_sandboxes: int | None = Field(default=None, ge=0, le=1_000_000, alias="maxSandboxes")
    max_running: int | None = Field(default=None, ge=0, le=1_000_000, alias="maxRunning")
    creates_per_minute: float | None = Field(
        default=None, ge=0, le=1_000_000, alias="createsPerMinute"
    )
    create_burst: int | None = Field(default=None, ge=1, le=1_000_000, alias="createBurst")
    resumes_per_minute: float | None = Field(
        default=None, ge=0, le=1_000_000, alias="resumesPerMinute"
    )
    resume_burst: int | None = Field(default=None, ge=1, le=1_000_000, alias="resumeBurst")
    max_snapshots: int | None = Field(default=None, ge=0, le=1_000_000, alias="maxSnapshots")

    def is_empty(self) -> bool:
        return all(v is None for v in self.model_dump().values())


class Quota(BaseModel):
    """What applies to one user: the defaults with their override on top."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    max_sandboxes: int = Field(alias="maxSandboxes")
    max_running: int = Field(alias="maxRunning")
    creates_per_minute: float = Field(alias="createsPerMinute")
    create_burst: int = Field(alias="createBurst")
    resumes_per_minute: float = Field(alias="resumesPerMinute")
    resume_burst: int = Field(alias="resumeBurst")
    max_snapshots: int = Field(alias="maxSnapshots")


def effective(defaults: QuotaSettings, override: QuotaOverride | None) -> Quota:
    values = {name: getattr(defaults, name) for name in Quota.model_fields}
    if override is not None:
        values.update({k: v for k, v in override.model_dump().items() if v is not None})
    return Quota(**values)
