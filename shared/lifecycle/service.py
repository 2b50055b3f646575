"""``SandboxLifecycle``: the application service the api, proxy and CLI call.

It never touches the runtime or a daemon. It reads and waits on the KV record (the source of
truth), pre-checks transitions for a fast 409, and publishes idempotent commands whose message
ids are derived from the sandbox id and generation (``pause:<sid>:g<gen>``): concurrent callers,
and a user pause racing a timeout pause, publish the same id and share one transition.

Decisions written down here:
- Killed sandboxes stay in KV as tombstones (``state=killed``) until ``retain_until``; to users
  they do not exist (``NotFound``, not listed), and their id may be created again (the new record
  continues the tombstone's generation, so its ``create`` message id is not deduplicated).
- ``pause`` of a sandbox that is creating or resuming waits for it to be running, then pauses;
  ``resume`` of a sandbox that is pausing waits for the pause, then resumes.
- A transition that gave up surfaces as ``RuntimeFailure`` carrying the recorded reason.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import structlog

from shared.domain import states
from shared.domain import transitions as t
from shared.domain.record import SandboxRecord
from shared.domain.states import SandboxState
from shared.domain.timing import deadline_after, predates_client_deadline
from shared.errors import Conflict, IllegalTransition, NotFound, PauseRefused, RuntimeFailure
from shared.ids import is_valid_sandbox_id
from shared.lifecycle.hooks import describe
from shared.models.messages import (
    CreateSandbox,
    KillSandbox,
    PauseSandbox,
    ResumeSandbox,
    SandboxActivity,
    SandboxTimeoutSet,
    SetSandboxNetwork,
)
from shared.models.network import NetworkPolicy
from shared.ports.bus import Publisher, SandboxStore, emit
from shared.ports.lifecycle import CreateRequest, ResumeResult
from shared.spans import Spans

log = structlog.get_logger()


def _now() -> datetime:
    return datetime.now(UTC)


def new_sandbox_id() -> str:
    """E2B-style id: 20 lowercase alphanumerics (valid as subject token, DNS label, RS name)."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "i" + "".join(secrets.choice(alphabet) for _ in range(19))


class SandboxLifecycle:
    """``shared.ports.lifecycle.Lifecycle`` over a ``SandboxStore`` and a ``Publisher``."""

    def __init__(
        self,
        store: SandboxStore,
        publisher: Publisher,
        *,
        admission: Callable[[SandboxRecord], Awaitable[None]] | None = None,
    ) -> None:
        self._store = store
        self._publisher = publisher
        # Run on a create once its record is inserted (so counted), before the command goes out:
        # the api's quota check. Raising refuses the create and removes the record.
        self._admission = admission

    # ---- reads ------------------------------------------------------------------------------

    async def get(self, sandbox_id: str, *, owner: str | None) -> SandboxRecord:
        record = await self._store.get(sandbox_id) if is_valid_sandbox_id(sandbox_id) else None
        if record is None or not states.exists(record.state):
            raise NotFound(f"sandbox {sandbox_id} not found")
        if owner is not None and record.owner != owner:
            raise NotFound(f"sandbox {sandbox_id} not found")  # others' sandboxes do not exist
        return record

    async def list(self, *, owner: str | None) -> list[SandboxRecord]:
        records = await self._store.list()
        return sorted(
            (r for r in records if states.exists(r.state) and (owner is None or r.owner == owner)),
            key=lambda r: r.created_at,
        )

    # ---- create -----------------------------------------------------------------------------

    async def create(self, request: CreateRequest, *, wait: float = 60.0) -> SandboxRecord:
        spans = Spans()
        sandbox_id = request.sandbox_id or new_sandbox_id()
        if not is_valid_sandbox_id(sandbox_id):
            raise ValueError(f"invalid sandbox id {sandbox_id!r}")
        at = _now()
        record = SandboxRecord(
            sandbox_id=sandbox_id,
            owner=request.owner,
            name=request.name,
            template=request.template,
            state=SandboxState.CREATING,
            generation=0,
            timeout=request.timeout,
            auto_pause=request.auto_pause,
            auto_pause_memory=request.auto_pause_memory,
            auto_resume=request.auto_resume,
            metadata=dict(request.metadata),
            envs=dict(request.envs),
            network=request.network,
            hooks=request.hooks,
            origin_snapshot_id=request.origin_snapshot_id,
            origin=request.origin,
            # hex: never starts with "-" (argv-safe). None: E2B's secure=False, the id alone
            # reaches the daemon (docs/security.md).
            envd_access_token=secrets.token_hex(24) if request.secure else None,
            created_at=at,
            started_at=at,
            updated_at=at,
        )
        record = await self._insert(record)
        spans.mark("insert")
        command = CreateSandbox(
            sandbox_id=sandbox_id,
            owner=request.owner,
            template=request.template,
            timeout=request.timeout,
            auto_pause=request.auto_pause,
            auto_resume=request.auto_resume,
            metadata=dict(request.metadata),
        )
        try:
            if self._admission is not None:
                await self._admission(record)
            spans.mark("admit")
            await emit(self._publisher, command, generation=record.generation)
            spans.mark("publish")
        except Exception:
            # Refused, or nobody will ever act on this record: remove it so the id can be
            # used again.
            await self._store.delete(sandbox_id)
            raise
        done = await self._wait(
            sandbox_id,
            lambda r: r.state != SandboxState.CREATING or r.generation > record.generation,
            wait,
        )
        spans.mark("wait")
        log.info("create_api_timing", sandbox_id=sandbox_id, **spans.as_ms())
        return self._settled(done, "create")

    async def _insert(self, record: SandboxRecord) -> SandboxRecord:
        """Create the record; reuse a killed tombstone's id (continuing its generation)."""
        try:
            return await self._store.create(record)
        except Conflict:
            existing = await self._store.get(record.sandbox_id)
            if existing is None or existing.state != SandboxState.KILLED:
                raise

        def replace(current: SandboxRecord) -> SandboxRecord:
            # Another owner's tombstone is never reused: its history is not the new owner's.
            if current.state != SandboxState.KILLED or current.owner != record.owner:
                raise Conflict(f"sandbox {record.sandbox_id} already exists")
            return record.model_copy(update={"generation": current.generation + 1})

        return await self._store.update(record.sandbox_id, replace)

    # ---- pause / resume / kill --------------------------------------------------------------

    async def pause(
        self, sandbox_id: str, *, owner: str | None, wait: float = 55.0, memory: bool = False
    ) -> SandboxRecord:
        until = time.monotonic() + wait
        record = await self.get(sandbox_id, owner=owner)
        if states.is_starting(record.state):
            record = await self._wait(
                sandbox_id, lambda r: not states.is_transitional(r.state), wait
            )
        if record.state == SandboxState.PAUSED:
            raise IllegalTransition(f"sandbox {sandbox_id} is already paused", state="paused")
        if states.is_gone(record.state):
            raise NotFound(f"sandbox {sandbox_id} not found")
        if t.can_pause(record.state):
            await emit(
                self._publisher,
                PauseSandbox(
                    sandbox_id=sandbox_id,
                    generation=record.generation,
                    reason="user",
                    memory=memory,
                ),
            )
        elif record.state != SandboxState.PAUSING:
            raise IllegalTransition(
                f"sandbox {sandbox_id} cannot be paused while {record.state.value}",
                state=record.state.value,
            )
        start_gen = record.generation
        done = await self._wait(
            sandbox_id,
            lambda r: r.generation > start_gen and states.is_settled(r.state),
            _left(until),
        )
        if done.state == SandboxState.RUNNING and done.refused_pause is not None:
            refused = done.refused_pause
            raise PauseRefused(
                f"sandbox {sandbox_id} keeps running: {describe(refused)}",
                hook=refused.model_dump(mode="json"),
            )
        return self._settled(done, "pause", want=SandboxState.PAUSED)

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
        until = time.monotonic() + wait
        spans = Spans()
        record = await self.get(sandbox_id, owner=owner)
        spans.mark("get")
        if record.state == SandboxState.CREATING:
            done = await self._wait(sandbox_id, lambda r: r.state != SandboxState.CREATING, wait)
            return ResumeResult(record=self._settled(done, "create"), resumed=False)
        if record.state == SandboxState.RUNNING:
            return ResumeResult(record=record, resumed=False)
        if states.is_gone(record.state):
            raise NotFound(f"sandbox {sandbox_id} not found")
        if record.state == SandboxState.PAUSING:
            record = await self._wait(sandbox_id, lambda r: r.state != SandboxState.PAUSING, wait)
            if record.state == SandboxState.RUNNING:  # the pause failed back to running
                return ResumeResult(record=record, resumed=False)
        if t.can_resume(record.state):
            await emit(
                self._publisher,
                ResumeSandbox(
                    sandbox_id=sandbox_id,
                    generation=record.generation,
                    timeout=timeout,
                    auto_pause=auto_pause,
                    memory=memory,
                    reason="user",
                ),
            )
        spans.mark("publish")
        start_gen = record.generation
        done = await self._wait(
            sandbox_id,
            lambda r: r.generation > start_gen and states.is_settled(r.state),
            _left(until),
        )
        spans.mark("wait")
        log.info("resume_api_timing", sandbox_id=sandbox_id, **spans.as_ms())
        return ResumeResult(record=self._settled(done, "resume"), resumed=True)

    async def kill(self, sandbox_id: str, *, owner: str | None, wait: float = 30.0) -> None:
        record = await self.get(sandbox_id, owner=owner)
        if record.state != SandboxState.KILLING:
            await emit(
                self._publisher,
                KillSandbox(sandbox_id=sandbox_id, generation=record.generation, reason="user"),
            )
        try:
            await self._wait(sandbox_id, lambda r: r.state == SandboxState.KILLED, wait)
        except NotFound:
            return  # the key was removed: as dead as it gets

    # ---- network ------------------------------------------------------------------------------

    async def set_network(
        self, sandbox_id: str, *, owner: str | None, policy: NetworkPolicy
    ) -> SandboxRecord:
        await self.get(sandbox_id, owner=owner)

        def mutate(record: SandboxRecord) -> SandboxRecord:
            if states.is_gone(record.state):
                raise NotFound(f"sandbox {sandbox_id} not found")
            return record.model_copy(update={"network": policy})

        record = await self._store.update(sandbox_id, mutate)
        # Unique per write (updated_at): setting A, B, then A again must apply A again.
        await emit(
            self._publisher,
            SetSandboxNetwork(sandbox_id=sandbox_id, generation=record.generation),
            record.updated_at.isoformat(),
        )
        return record

    # ---- timeouts and activity -------------------------------------------------------------

    async def set_timeout(
        self, sandbox_id: str, *, owner: str | None, timeout: int
    ) -> SandboxRecord:
        await self.get(sandbox_id, owner=owner)
        return await self._move_deadline(sandbox_id, timeout=timeout, only_later=False)

    async def extend_timeout(
        self, sandbox_id: str, *, owner: str | None, timeout: int
    ) -> SandboxRecord:
        await self.get(sandbox_id, owner=owner)
        return await self._move_deadline(sandbox_id, timeout=timeout, only_later=True)

    async def touch(self, sandbox_id: str, *, seen_at: datetime | None = None) -> None:
        record = await self._store.get(sandbox_id)
        if record is None or not states.is_running(record.state):
            return
        # The deadline moves in KV; an ``activity`` event (not ``timeout_set``) tells the scheduler.
        updated = await self._move_deadline(
            sandbox_id, timeout=None, only_later=True, announce=False, seen_at=seen_at
        )
        if predates_client_deadline(updated, seen_at):
            return  # no event either: the scheduler would extend by it as the record refused to
        bucket = int(time.time())  # one activity event per sandbox per second at most
        # ``at`` is when it was seen, not now: a client may set the deadline between the two,
        # and the scheduler must then refuse this event as the record did.
        await emit(
            self._publisher,
            SandboxActivity(
                sandbox_id=sandbox_id, generation=updated.generation, at=seen_at or _now()
            ),
            str(bucket),
        )

    async def _move_deadline(
        self,
        sandbox_id: str,
        *,
        timeout: int | None,
        only_later: bool,
        announce: bool = True,
        seen_at: datetime | None = None,
    ) -> SandboxRecord:
        """Running: deadline = now + timeout (the new timeout is kept for later activity).
        Not running: only the timeout is stored; it applies from the next resume.
        ``timeout=0`` (E2B's ``set_timeout(0)``): the deadline is now, so the scheduler expires
        the sandbox at once by its usual rule; the stored inactivity timeout is kept.
        ``timeout=None`` is activity seen at ``seen_at``: void when a client set the deadline
        since (its touch landed late: ``set_timeout(0)`` right after a request must hold)."""
        changed = False

        def mutate(record: SandboxRecord) -> SandboxRecord:
            nonlocal changed
            changed = False
            effective = record.timeout if timeout is None else timeout
            if not states.is_running(record.state) or record.deadline is None:
                if timeout is None or only_later or timeout == 0:
                    return record
                return record.model_copy(update={"timeout": effective})
            if timeout is None and predates_client_deadline(record, seen_at):
                return record
            now = _now()
            deadline = deadline_after(now, effective)
            if only_later and deadline <= record.deadline:
                return record
            changed = True
            update: dict[str, object] = {"deadline": deadline}
            if timeout is not None:
                update["deadline_set_at"] = now
            if not only_later and effective > 0:
                update["timeout"] = effective
            return record.model_copy(update=update)

        record = await self._store.update(sandbox_id, mutate)
        if announce and changed and record.deadline is not None:
            await emit(
                self._publisher,
                SandboxTimeoutSet(
                    sandbox_id=sandbox_id,
                    generation=record.generation,
                    at=_now(),
                    deadline=record.deadline,
                ),
                record.deadline.isoformat(),
            )
        return record

    # ---- helpers ------------------------------------------------------------------------------

    async def _wait(
        self, sandbox_id: str, predicate: Callable[[SandboxRecord], bool], wait: float
    ) -> SandboxRecord:
        try:
            return await self._store.wait_for(sandbox_id, predicate, timeout=max(wait, 0.1))
        except TimeoutError:
            msg = (
                f"sandbox {sandbox_id}: the transition did not finish within {wait:.0f}s; "
                "it is still queued and will complete"
            )
            raise TimeoutError(msg) from None

    @staticmethod
    def _settled(
        record: SandboxRecord, op: str, *, want: SandboxState = SandboxState.RUNNING
    ) -> SandboxRecord:
        if states.is_gone(record.state):
            raise NotFound(f"sandbox {record.sandbox_id} was killed")
        if record.state == SandboxState.FAILED or (
            # A resume that gave up back to paused (its pod never became ready).
            op == "resume" and record.state == SandboxState.PAUSED and record.failure
        ):
            raise RuntimeFailure(f"{op} of {record.sandbox_id} failed: {record.failure}")
        if record.state != want:
            raise IllegalTransition(
                f"sandbox {record.sandbox_id} is {record.state.value}, not {want.value}",
                state=record.state.value,
            )
        return record


def _left(until: float) -> float:
    return max(0.1, until - time.monotonic())
