"""The sandbox record: the single source of truth, one KV entry per sandbox, CAS-only writes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.domain.states import SandboxState
from shared.models.lifecycle import NO_HOOKS, HookOutcome, Hooks
from shared.models.messages import ResumeReport, StartPath
from shared.models.network import OPEN, NetworkPolicy

SCHEMA_VERSION = 1


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
    # The pause command that captured it: how a redelivered pause recognises its own capture.
    # None for an origin (a stored snapshot a sandbox starts from) and for records written before.
    pause_msg_id: str | None = None


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
    # A timeout pause keeps the processes' memory where the runtime can (E2B's create
    # ``autoPauseMemory: true``); else it keeps files only, as a pause without ``memory``.
    auto_pause_memory: bool = False
    auto_resume: bool = False
    metadata: dict[str, str] = Field(default_factory=dict)
    envs: dict[str, str] = Field(default_factory=dict)
    envd_access_token: str | None = None
    network: NetworkPolicy = OPEN
    host: str | None = None  # the current pod's daemon address (pod IP); None unless running
    pod_uid: str | None = None
    # How the current pod came (a warm pool's, or started for it): what a re-sent ``created`` says.
    path: StartPath | None = None
    created_at: datetime
    started_at: datetime  # last time it became running (create or resume)
    deadline: datetime | None = None  # None while paused / killed
    # When a client last set the deadline (set_timeout, connect, refresh): activity seen before
    # it (a proxied request whose touch lands late) does not move that deadline.
    deadline_set_at: datetime | None = None
    paused_at: datetime | None = None
    retain_until: datetime | None = None  # paused sandboxes are deleted after this
    snapshot: SnapshotRef | None = None
    # Started from a stored snapshot (create from a snapshot id, fork): its id (for the files)
    # and its process list, replayed once the first pod is ready.
    origin_snapshot_id: str | None = None
    origin: SnapshotRef | None = None
    pending: Pending | None = None
    failure: str | None = None  # reason of the last transition that gave up
    last_resume: ResumeReport | None = None  # what the last resume restored, and its time
    hooks: Hooks = NO_HOOKS  # the sandbox's own lifecycle hooks (its template's run first)
    refused_pause: HookOutcome | None = None  # the prePause that refused the last pause
    updated_at: datetime


# A change to a record, re-evaluated on every compare-and-set attempt (``SandboxStore.update``).
Mutation = Callable[[SandboxRecord], SandboxRecord]
