"""The lifecycle port: create / pause / resume / kill / timeouts of sandboxes, for one owner.

Implemented by ``shared.lifecycle.service.SandboxLifecycle`` over the ``SandboxStore`` (KV, reads
and waits) and the ``Publisher`` (commands and events). Every method takes the calling user as
``owner``: another user's sandbox is ``NotFound`` (404), never 403.

Errors: ``NotFound``; ``IllegalTransition`` (409, e.g. pausing a paused sandbox); ``Conflict``
(create with an id that exists); ``TimeoutError`` when a transition did not finish within
``wait`` seconds (the command stays queued and will still complete); ``Unavailable`` (bus down).
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from shared.domain.record import SandboxRecord, SnapshotRef
from shared.models.lifecycle import NO_HOOKS, Hooks
from shared.models.network import OPEN, NetworkPolicy


class CreateRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    owner: str
    sandbox_id: str | None = None  # None: generate one
    name: str | None = None  # native name (see shared.ids.owned_sandbox_id)
    template: str = "sandbox-base"
    timeout: int = Field(default=300, ge=1)
    auto_pause: bool = False
    auto_pause_memory: bool = False  # a timeout pause keeps memory (see SandboxRecord)
    auto_resume: bool = False
    metadata: dict[str, str] = Field(default_factory=dict)
    envs: dict[str, str] = Field(default_factory=dict)
    secure: bool = True  # False: no envd access token (E2B's ``secure=False``)
    network: NetworkPolicy = OPEN
    hooks: Hooks = NO_HOOKS  # the sandbox's own lifecycle hooks (docs/lifecycle-hooks.md)
    # Start from a stored snapshot: its files are copied in, its processes replayed.
    origin_snapshot_id: str | None = None
    origin: SnapshotRef | None = None


class ResumeResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    record: SandboxRecord
    resumed: bool  # True if this call took the sandbox out of paused (E2B connect: 201)


class Lifecycle(Protocol):
    async def create(self, request: CreateRequest, *, wait: float = 60.0) -> SandboxRecord:
        """Publish ``create``; return once the sandbox is running (pod ready)."""
        ...

    async def get(self, sandbox_id: str, *, owner: str | None) -> SandboxRecord:
        """``owner=None`` is the admin view (any owner)."""
        ...

    async def list(self, *, owner: str | None) -> list[SandboxRecord]: ...

    async def pause(
        self, sandbox_id: str, *, owner: str | None, wait: float = 55.0, memory: bool = False
    ) -> SandboxRecord:
        """Manual pause (always allowed, no feature flag). ``IllegalTransition`` if already
        paused; waits through an in-flight pause. ``memory``: keep the processes' memory where
        the runtime can (E2B's pause ``memory: true``); else files only."""
        ...

    async def resume(
        self,
        sandbox_id: str,
        *,
        owner: str | None,
        timeout: int | None = None,
        auto_pause: bool | None = None,
        memory: bool | None = None,
        wait: float = 55.0,
    ) -> ResumeResult:
        """Resume a paused sandbox (no-op returning ``resumed=False`` when already running).
        Concurrent callers share one resume (same message id for the same generation).
        ``auto_pause``, when given, is whether the resumed sandbox pauses on timeout;
        ``memory=False`` boots from the kept files even where the pause kept memory."""
        ...

    async def kill(self, sandbox_id: str, *, owner: str | None, wait: float = 30.0) -> None: ...

    async def set_timeout(
        self, sandbox_id: str, *, owner: str | None, timeout: int
    ) -> SandboxRecord:
        """New inactivity timeout from now (may shorten)."""
        ...

    async def extend_timeout(
        self, sandbox_id: str, *, owner: str | None, timeout: int
    ) -> SandboxRecord:
        """E2B connect semantics: move the deadline only if that makes it later."""
        ...

    async def set_network(
        self, sandbox_id: str, *, owner: str | None, policy: NetworkPolicy
    ) -> SandboxRecord:
        """Store the new policy on the record and ask the scaler to apply it to the workload
        (``sandbox.cmd.network``). Returns without waiting for the runtime."""
        ...

    async def touch(self, sandbox_id: str, *, seen_at: datetime | None = None) -> None:
        """Activity (throttled by the caller) seen at ``seen_at`` (default now): pushes the
        deadline by the sandbox's timeout, unless a client set the deadline after it."""
        ...
