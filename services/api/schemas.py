"""Wire shapes. E2B models spell their JSON keys exactly as the SDK's generated client does
(``templateID``, ``sandboxID``, ``envdAccessToken``, ``allow_internet_access``…); native models
use camelCase. Requests ignore unknown keys so newer SDKs keep working."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.ids import SANDBOX_ID_PATTERN


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class _Out(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True)


class ErrorBody(_Out):
    code: int = Field(description="The HTTP status code, repeated")
    message: str


# ---------------------------------------------------------------- E2B requests


class AutoResumeConfig(_In):
    enabled: bool = False


class LifecycleIn(_In):
    """The object form some SDKs send instead of ``autoPause``/``autoResume``."""

    on_timeout: Literal["pause", "kill"] | None = Field(default=None, alias="onTimeout")
    auto_resume: bool | None = Field(default=None, alias="autoResume")


class NewSandbox(_In):
    template_id: str = Field(default="base", alias="templateID", min_length=1, max_length=253)
    timeout: int | None = Field(default=None, ge=1, le=2**31 - 1)
    auto_pause: bool | None = Field(default=None, alias="autoPause")
    auto_pause_memory: bool | None = Field(default=None, alias="autoPauseMemory")
    auto_resume: AutoResumeConfig | bool | None = Field(default=None, alias="autoResume")
    lifecycle: LifecycleIn | None = None
    secure: bool | None = None
    allow_internet_access: bool | None = None
    metadata: dict[str, str] | None = None
    env_vars: dict[str, str] | None = Field(default=None, alias="envVars")

    def wants_auto_pause(self) -> bool:
        if self.auto_pause is not None:
            return self.auto_pause
        return bool(self.lifecycle and self.lifecycle.on_timeout == "pause")

    def wants_auto_resume(self) -> bool:
        if isinstance(self.auto_resume, AutoResumeConfig):
            return self.auto_resume.enabled
        if isinstance(self.auto_resume, bool):
            return self.auto_resume
        return bool(self.lifecycle and self.lifecycle.auto_resume)


class ConnectSandbox(_In):
    timeout: int | None = Field(default=None, ge=0, le=2**31 - 1)
    memory: bool | None = None


class ResumedSandbox(_In):
    timeout: int | None = Field(default=None, ge=0, le=2**31 - 1)
    auto_pause: bool | None = Field(default=None, alias="autoPause")
    memory: bool | None = None


class PauseRequest(_In):
    memory: bool | None = None
    require_healthy_guest: bool | None = Field(default=None, alias="requireHealthyGuest")


class TimeoutRequest(_In):
    timeout: int = Field(ge=0, le=2**31 - 1)


class RefreshRequest(_In):
    duration: int | None = Field(default=None, ge=0, le=3600)


# ---------------------------------------------------------------- E2B responses


class SandboxOut(_Out):
    """``Sandbox`` (create / connect / resume)."""

    template_id: str = Field(alias="templateID")
    sandbox_id: str = Field(alias="sandboxID")
    client_id: str = Field(alias="clientID")
    envd_version: str = Field(alias="envdVersion")
    envd_access_token: str | None = Field(default=None, alias="envdAccessToken")
    traffic_access_token: str | None = Field(default=None, alias="trafficAccessToken")
    domain: str | None = None
    alias: str | None = None


class LifecycleOut(_Out):
    auto_resume: bool = Field(alias="autoResume")
    on_timeout: Literal["kill", "pause"] = Field(alias="onTimeout")


class ListedSandboxOut(_Out):
    template_id: str = Field(alias="templateID")
    alias: str | None = None
    sandbox_id: str = Field(alias="sandboxID")
    client_id: str = Field(alias="clientID")
    started_at: datetime = Field(alias="startedAt")
    end_at: datetime = Field(alias="endAt")
    cpu_count: int = Field(alias="cpuCount")
    memory_mb: int = Field(alias="memoryMB")
    disk_size_mb: int = Field(alias="diskSizeMB")
    metadata: dict[str, str] = Field(default_factory=dict)
    state: Literal["running", "paused"]
    envd_version: str = Field(alias="envdVersion")


class SandboxDetailOut(ListedSandboxOut):
    envd_access_token: str | None = Field(default=None, alias="envdAccessToken")
    domain: str | None = None
    allow_internet_access: bool | None = Field(default=None, alias="allowInternetAccess")
    lifecycle: LifecycleOut


class MetricOut(_Out):
    timestamp: datetime
    timestamp_unix: int = Field(alias="timestampUnix")
    cpu_count: int = Field(alias="cpuCount")
    cpu_used_pct: float = Field(alias="cpuUsedPct")
    mem_used: int = Field(alias="memUsed")
    mem_total: int = Field(alias="memTotal")
    mem_cache: int = Field(default=0, alias="memCache")
    disk_used: int = Field(alias="diskUsed")
    disk_total: int = Field(alias="diskTotal")


class SandboxLogsOut(_Out):
    logs: list[dict[str, Any]] = Field(default_factory=list)
    log_entries: list[dict[str, Any]] = Field(default_factory=list, alias="logEntries")


# ---------------------------------------------------------------- native API


class NativeCreate(_In):
    name: str | None = Field(
        default=None,
        pattern=SANDBOX_ID_PATTERN,
        description="The sandbox name (lowercase DNS label); generated when omitted",
    )
    template: str = Field(default="sandbox-base", min_length=1, max_length=253)
    timeout: int = Field(default=300, ge=1, le=2**31 - 1, description="Inactivity timeout, s")
    auto_pause: bool = Field(default=False, alias="autoPause")
    auto_resume: bool = Field(default=False, alias="autoResume")
    metadata: dict[str, str] = Field(default_factory=dict)
    envs: dict[str, str] = Field(default_factory=dict)


class SnapshotOut(_Out):
    annotation: str = Field(description="base64 of the snapshot JSON (the ReplicaSet annotation)")
    captured_at: str = Field(alias="capturedAt")
    process_count: int = Field(alias="processCount")


class NativeSandbox(_Out):
    name: str
    owner: str
    template: str
    state: str = Field(description="The real state, including transitional ones")
    timeout: int
    auto_pause: bool = Field(alias="autoPause")
    auto_resume: bool = Field(alias="autoResume")
    metadata: dict[str, str]
    created_at: datetime = Field(alias="createdAt")
    started_at: datetime = Field(alias="startedAt")
    deadline: datetime | None = None
    paused_at: datetime | None = Field(default=None, alias="pausedAt")
    retain_until: datetime | None = Field(default=None, alias="retainUntil")
    snapshot: SnapshotOut | None = None
    failure: str | None = None
    envd_access_token: str | None = Field(default=None, alias="envdAccessToken")


class NativeList(_Out):
    sandboxes: list[NativeSandbox]
