"""The scheduler's ``Timers`` port in memory, with NATS message-schedule semantics.

One pending timer per holder subject (``sandbox.sched.<holder>.<sid>``): arming again replaces
it, cancelling removes it. ``due(now)`` hands out, and removes, every timer whose time has come,
as the server does when it fires a schedule into ``sandbox.timer.fired.<sid>``.
"""

from __future__ import annotations

from datetime import datetime

from shared.bus.schedules import Holder, Timer


class FakeTimers:
    def __init__(self) -> None:
        self.pending_timers: dict[tuple[str, Holder], Timer] = {}
        self.armed: list[Timer] = []  # every arm call, in order
        self.cancelled: list[tuple[str, Holder]] = []

    async def arm(self, timer: Timer) -> None:
        self.armed.append(timer)
        self.pending_timers[(timer.sandbox_id, timer.holder)] = timer

    async def cancel(self, sandbox_id: str, holder: Holder) -> None:
        self.cancelled.append((sandbox_id, holder))
        self.pending_timers.pop((sandbox_id, holder), None)

    async def pending(self, sandbox_id: str, holder: Holder) -> Timer | None:
        return self.pending_timers.get((sandbox_id, holder))

    def due(self, now: datetime) -> list[Timer]:
        """Fire: every timer due by ``now``, earliest first, removed from its holder."""
        fired = sorted((t for t in self.pending_timers.values() if t.due <= now), key=_due)
        for timer in fired:
            del self.pending_timers[(timer.sandbox_id, timer.holder)]
        return fired

    def next_due(self) -> datetime | None:
        return min((t.due for t in self.pending_timers.values()), default=None)


def _due(timer: Timer) -> datetime:
    return timer.due
