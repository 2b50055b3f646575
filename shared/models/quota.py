"""Per-user quota overrides (stored on the user record) and the quota that applies to a user.
0 means unlimited."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


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
