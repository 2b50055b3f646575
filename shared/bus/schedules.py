"""What a durable timer is: its kind, its payload, the holder subject and its message id.

Each sandbox has at most two pending server-side schedules (NATS message schedules, one per
holder subject; re-publishing a holder replaces it, purging it cancels it):

- ``sandbox.sched.timeout.<sid>``: the inactivity deadline while running (kind ``timeout``), or,
  after a timeout pause was ordered, the check that the pause really happened (``pause_check``);
- ``sandbox.sched.retention.<sid>``: the end of retention while paused (kind ``retention``).

All of them fire into ``sandbox.timer.fired.<sid>``; the body says which timer it was.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

from shared.bus import subjects

TimerKind = Literal["timeout", "pause_check", "retention"]
Holder = Literal["timeout", "retention"]

SCHED_RETENTION = "sandbox.sched.retention"

_HOLDER_PREFIX: dict[Holder, str] = {
    "timeout": subjects.SCHED_TIMEOUT,
    "retention": SCHED_RETENTION,
}


class Timer(BaseModel):
    """The body of a schedule holder, delivered unchanged on ``sandbox.timer.fired.<sid>``."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    schema_version: Literal[1] = 1
    kind: TimerKind
    sandbox_id: str
    generation: int
    due: datetime
    attempt: int = 0  # pause_check: how many timeout pauses were ordered so far

    @field_validator("due")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        # The server rejects naive datetimes (pitfall 12); normalise everything to UTC.
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    @property
    def holder(self) -> Holder:
        return "retention" if self.kind == "retention" else "timeout"

    def holder_subject(self) -> str:
        return holder_subject(self.holder, self.sandbox_id)

    def msg_id(self) -> str:
        """Deterministic: arming the same timer twice (redelivery, two replicas) stores it once."""
        due = self.due.isoformat()
        if self.kind == "timeout":
            return f"sched:{self.sandbox_id}:g{self.generation}:{due}"
        if self.kind == "pause_check":
            return f"sched:{self.sandbox_id}:g{self.generation}:check{self.attempt}:{due}"
        return f"retention:{self.sandbox_id}:g{self.generation}:{due}"


def holder_subject(holder: Holder, sandbox_id: str) -> str:
    return subjects.of(_HOLDER_PREFIX[holder], sandbox_id)


def fired_subject(sandbox_id: str) -> str:
    return subjects.of(subjects.TIMER_FIRED, sandbox_id)
