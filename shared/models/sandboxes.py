"""The sandbox record: the single source of truth, one KV entry per sandbox, CAS-only writes."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.models.network import OPEN, NetworkPolicy

SCHEMA_VERSION = 1


class SandboxState(StrEnum):
    CREATING = "creating"  # record written, first pod not ready yet (E2B: running)
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    RESUMING = "resuming"
    KILLING = "killing"
    KILLED = "killed"
    FAILED = "failed"

    @property
    def e2b(self) -> Literal["running", "paused"]:
        """E2B only knows running and paused: map transitional states to the nearer one."""
        if self in (SandboxState.PAUSED, SandboxState.PAUSING):
            return "paused"
        return "running"


# Which states each transition may start from (the state machine, in one place).
TRANSITIONS: dict[str, tuple[frozenset[SandboxState], SandboxState]] = {
    "created": (frozenset({SandboxState.CREATING}), SandboxState.RUNNING),
    "pause": (frozenset({SandboxState.RUNNING}), SandboxState.PAUSING),
    "paused": (frozenset({SandboxState.PAUSING}), SandboxState.PAUSED),
    "resume": (frozenset({SandboxState.PAUSED, SandboxState.FAILED}), SandboxState.RESUMING),
    "resumed": (frozenset({SandboxState.RESUMING}), SandboxState.RUNNING),
    "kill": (
        frozenset(
            {
                SandboxState.CREATING,
                SandboxState.RUNNING,
                SandboxState.PAUSING,
                SandboxState.PAUSED,
                SandboxState.RESUMING,
                SandboxState.FAILED,
                SandboxState.KILLING,
            }
        ),
        SandboxState.KILLING,
    ),
    "killed": (frozenset({SandboxState.KILLING}), SandboxState.KILLED),
}


class Pending(BaseModel):
    """The transition in flight: lets a redelivered command recognise its own work."""

    model_config = ConfigDict(frozen=True)

    op: Literal["create", "pause", "resume", "kill"]
    cmd_msg_id: str
    started_at: datetime


class SnapshotRef(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    captured_at: str
    process_count: int
    annotation: str  # the base64 value, as stored on the ReplicaSet (shown as metadata.snapshot)


class SandboxRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    schema_version: int = SCHEMA_VERSION
    sandbox_id: str
    owner: str
    name: str | None = None  # the native API's name (unique per owner); None: the id is shown
    template: str = "sandbox-base"
    state: SandboxState = SandboxState.RUNNING
    generation: int = 0
    timeout: int = 300  # seconds of inactivity before expiry
    auto_pause: bool = False
    auto_resume: bool = False
    metadata: dict[str, str] = Field(default_factory=dict)
    envs: dict[str, str] = Field(default_factory=dict)
    envd_access_token: str | None = None
    network: NetworkPolicy = OPEN
    host: str | None = None  # the current pod's daemon address (pod IP); None unless running
    pod_uid: str | None = None
    created_at: datetime
    started_at: datetime  # last time it became running (create or resume)
    deadline: datetime | None = None  # None while paused / killed
    paused_at: datetime | None = None
    retain_until: datetime | None = None  # paused sandboxes are deleted after this
    snapshot: SnapshotRef | None = None
    pending: Pending | None = None
    failure: str | None = None  # reason of the last transition that gave up
    updated_at: datetime

    def can(self, transition: str) -> bool:
        allowed, _ = TRANSITIONS[transition]
        return self.state in allowed
