"""Proxied traffic is activity: ``touch`` the sandbox at most once per interval per replica,
in the background, so the hot path never waits for the KV write. Except the daemon's
``/health`` (the SDK's ``is_running()``): asking whether a sandbox is up must not keep it up,
and must not move the ``endAt`` an E2B client just read."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Protocol

import structlog

log = structlog.get_logger()


HEALTH = "/health"


def is_activity(is_daemon: bool, path: str) -> bool:
    """Whether a request to a sandbox (the daemon's port or another) counts as its activity."""
    return not (is_daemon and path == HEALTH)


class Toucher(Protocol):
    async def touch(self, sandbox_id: str, *, seen_at: datetime | None = None) -> None: ...


class ActivityThrottle:
    def __init__(self, lifecycle: Toucher, *, interval: float) -> None:
        self._lifecycle = lifecycle
        self._interval = interval
        self._last: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def seen(self, sandbox_id: str) -> None:
        now = time.monotonic()
        if now - self._last.get(sandbox_id, -1e18) < self._interval:
            return
        self._last[sandbox_id] = now
        if len(self._last) > 100_000:  # forget sandboxes idle for long
            cutoff = now - 10 * max(self._interval, 1.0)
            self._last = {k: v for k, v in self._last.items() if v > cutoff}
        # The time it was seen goes along: a deadline a client set after it must hold.
        task = asyncio.create_task(self._touch(sandbox_id, datetime.now(UTC)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _touch(self, sandbox_id: str, seen_at: datetime) -> None:
        try:
            await self._lifecycle.touch(sandbox_id, seen_at=seen_at)
        except Exception as e:
            log.warning("touch_failed", sandbox_id=sandbox_id, error=repr(e))
            self._last.pop(sandbox_id, None)

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
