"""Getting a sandbox to ``running`` for a request: one shared resume per sandbox per replica
(concurrent requests await the same task; across replicas the lifecycle's message id, derived
from the sandbox's generation, makes their resume commands one)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter

from shared.domain import states
from shared.domain.record import SandboxRecord
from shared.ports.lifecycle import ResumeResult

log = structlog.get_logger()


class Resumer(Protocol):
    async def resume(
        self, sandbox_id: str, *, owner: str | None, wait: float = 55.0
    ) -> ResumeResult: ...


class NotRunningError(Exception):
    """The sandbox is paused and auto-resume is off (or it is going away)."""


class Waker:
    def __init__(
        self,
        lifecycle: Resumer,
        *,
        wait: float,
        registry: CollectorRegistry | None = None,
        admit: Callable[[SandboxRecord], Awaitable[None]] | None = None,
    ) -> None:
        self._lifecycle = lifecycle
        self._wait = wait
        # The owner's quota and resume rate, checked once per shared resume (every waiting
        # request gets its refusal): ``shared.quota.guard.QuotaGuard.before_resume``.
        self._admit = admit
        self._inflight: dict[str, asyncio.Task[SandboxRecord]] = {}
        self.resumes = Counter(
            "torpor_proxy_resumes_total",
            "Resumes started by the proxy (auto-resume on access), by outcome",
            ["outcome"],
            registry=registry,
        )

    def needs_waking(self, record: SandboxRecord) -> bool:
        return not states.is_running(record.state) or not record.host

    async def running(self, record: SandboxRecord) -> SandboxRecord:
        """A running record for this request, resuming (shared) or waiting when needed."""
        if not self.needs_waking(record):
            return record
        if states.is_resumable(record.state) and not record.auto_resume:
            msg = f"The sandbox {record.sandbox_id} was not found: it is {record.state.value}"
            raise NotRunningError(msg)
        if not (states.is_starting(record.state) or states.is_resumable(record.state)):
            msg = f"The sandbox {record.sandbox_id} was not found"
            raise NotRunningError(msg)
        task = self._inflight.get(record.sandbox_id)
        if task is None:
            task = asyncio.create_task(self._resume(record), name=f"resume-{record.sandbox_id}")
            self._inflight[record.sandbox_id] = task
            task.add_done_callback(lambda _: self._inflight.pop(record.sandbox_id, None))
        # Shielded: a client that gives up must not cancel the resume others are waiting for.
        return await asyncio.shield(task)

    async def _resume(self, record: SandboxRecord) -> SandboxRecord:
        log.info("auto_resume", sandbox_id=record.sandbox_id, state=record.state.value)
        try:
            if self._admit is not None and states.is_resumable(record.state):
                await self._admit(record)
            result = await self._lifecycle.resume(record.sandbox_id, owner=None, wait=self._wait)
        except Exception:
            self.resumes.labels("failed").inc()
            raise
        self.resumes.labels("resumed" if result.resumed else "joined").inc()
        return result.record
