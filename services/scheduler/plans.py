"""The scheduler's vocabulary: the plan a decision returns (``services.scheduler.expiry``) and
the events and facts it decides on. Carried out by ``services.scheduler.handlers``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel

from shared.bus.schedules import Holder, Timer
from shared.domain.record import Mutation
from shared.models.messages import address

Decision = Literal["pause", "kill"]


@dataclass(frozen=True)
class Policy:
    retention: timedelta
    pause_check: timedelta
    pause_attempts: int


@dataclass(frozen=True)
class Earned:
    """A deadline earned by activity inside the sandbox, and when that activity was (our clock)."""

    deadline: datetime
    seen_at: datetime


@dataclass(frozen=True)
class Watch:
    """The template's part in a timeout: how long before the deadline to warn, and the deadline
    that activity inside the sandbox earned (asked of its daemon by the handler), if any."""

    notice: timedelta = timedelta(0)
    earned: Earned | None = None


NO_WATCH = Watch()


@dataclass(frozen=True)
class Outgoing:
    subject: str
    message: BaseModel
    msg_id: str

    @classmethod
    def of(cls, message: BaseModel, *id_extra: str) -> Outgoing:
        """Addressed by the message itself (``shared.models.messages.address``)."""
        subject, mid = address(message, *id_extra)
        return cls(subject, message, mid)


@dataclass(frozen=True)
class Plan:
    """What to do, in this order: change the record, publish, cancel, arm."""

    outcome: str  # for logs and metrics: expired, stale, moved, retried, ...
    publish: tuple[Outgoing, ...] = ()
    arm: tuple[Timer, ...] = ()
    cancel: tuple[Holder, ...] = ()
    mutate: Mutation | None = None
    decision: Decision | None = None
    deadline: datetime | None = None  # the deadline that expired (lateness metric)


@dataclass(frozen=True)
class FailedPause:
    """A ``sandbox.evt.failed`` for op ``pause``, with the pending timeout-holder timer."""

    pending: Timer | None


@dataclass(frozen=True)
class Activity:
    at: datetime


@dataclass(frozen=True)
class Changed:
    """Any other lifecycle event: bring the timers in line with the record."""

    pending: Timer | None = field(default=None)
