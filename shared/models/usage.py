"""The usage ledger's arithmetic: one record per sandbox, moved by its lifecycle events.

Time between ``created``/``resumed`` and the next ``paused``/``killed`` is running time; time
between ``paused`` and the next ``resumed``/``killed`` is paused time. Each is weighed by size:
running seconds x cpu and x memory, paused seconds x the bytes kept. Intervals are measured on
the events' own ``at`` timestamps (when the transition happened, as recorded by the service that
made it), never on when the ledger happened to read them.

Exactly once: a record remembers the stream sequence of the last event it applied and the ids of
its recent events; a redelivered event (same sequence) or a re-published one (same id, new
sequence) changes nothing. Events are applied in stream order (the ledger's durable has one
message in flight at a time), so a record never sees an older event after a newer one.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_RECENT = 32
MIB = 1024 * 1024


class Size(BaseModel):
    model_config = ConfigDict(frozen=True)

    cpu: float  # cores
    memory_mb: int
    kept_bytes: int  # what a paused sandbox keeps (its disk)


class SandboxUsage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    sandbox_id: str
    owner: str
    template: str = "sandbox-base"
    size: Size
    state: Literal["running", "paused", "stopped"] = "stopped"
    since: datetime | None = None  # start of the open interval
    running_seconds: float = 0.0
    paused_seconds: float = 0.0
    cpu_seconds: float = 0.0
    memory_mb_seconds: float = 0.0
    kept_byte_seconds: float = 0.0
    resumes: int = 0
    replay_failures: int = 0
    last_seq: int = 0
    recent: tuple[str, ...] = ()  # ids of the last events applied

    def applied(self, event_id: str, seq: int) -> bool:
        return seq <= self.last_seq or event_id in self.recent

    def _close(self, at: datetime) -> SandboxUsage:
        """Add the open interval up to ``at`` (a clock step backwards adds nothing)."""
        if self.since is None or self.state == "stopped":
            return self
        seconds = max(0.0, (at - self.since).total_seconds())
        if self.state == "running":
            return self.model_copy(
                update={
                    "running_seconds": self.running_seconds + seconds,
                    "cpu_seconds": self.cpu_seconds + seconds * self.size.cpu,
                    "memory_mb_seconds": self.memory_mb_seconds + seconds * self.size.memory_mb,
                }
            )
        return self.model_copy(
            update={
                "paused_seconds": self.paused_seconds + seconds,
                "kept_byte_seconds": self.kept_byte_seconds + seconds * self.size.kept_bytes,
            }
        )

    def as_of(self, now: datetime) -> SandboxUsage:
        """The figures including the interval still open at ``now`` (for reading, not storing)."""
        return self._close(now).model_copy(update={"since": now if self.since else None})


FACTS = ("created", "paused", "resumed", "killed", "failed")


def _failures(payload: dict[str, Any]) -> int:
    processes = payload.get("processes") or []
    return sum(1 for p in processes if isinstance(p, dict) and p.get("error"))


def apply(
    usage: SandboxUsage | None,
    *,
    fact: str,
    payload: dict[str, Any],
    at: datetime,
    event_id: str,
    seq: int,
    sandbox_id: str,
    owner: str,
    template: str,
    size: Size,
) -> SandboxUsage | None:
    """The record after one event; ``None`` when the event changes nothing (a duplicate, or a
    fact that does not count)."""
    if fact not in FACTS:
        return None
    if usage is None:
        usage = SandboxUsage(sandbox_id=sandbox_id, owner=owner, template=template, size=size)
    elif usage.applied(event_id, seq):
        return None
    new = usage
    if fact == "created":
        new = usage._close(at).model_copy(
            update={"state": "running", "since": at, "template": template, "size": size}
        )
        new = new.model_copy(update={"replay_failures": new.replay_failures + _failures(payload)})
    elif fact == "paused" and usage.state == "running":
        new = usage._close(at).model_copy(update={"state": "paused", "since": at})
    elif fact == "resumed":
        new = usage._close(at).model_copy(
            update={
                "state": "running",
                "since": at,
                "resumes": usage.resumes + 1,
                "replay_failures": usage.replay_failures + _failures(payload),
            }
        )
    elif fact == "killed":
        new = usage._close(at).model_copy(update={"state": "stopped", "since": None})
    # ``failed`` (or a pause of a sandbox not running) moves no meter: a failed pause leaves the
    # pod running, a failed resume's pod is counted from the resume that brings it up.
    return new.model_copy(update={"last_seq": seq, "recent": (*usage.recent, event_id)[-_RECENT:]})


class Meters(BaseModel):
    """What the ledger measures, as the usage API shows it (per sandbox, and summed)."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, serialize_by_alias=True)

    running_seconds: float = Field(alias="runningSeconds")
    paused_seconds: float = Field(alias="pausedSeconds")
    cpu_seconds: float = Field(alias="cpuSeconds")
    memory_mb_seconds: float = Field(alias="memoryMbSeconds")
    kept_byte_seconds: float = Field(alias="keptByteSeconds")
    resumes: int
    replay_failures: int = Field(alias="replayFailures")


METERS = tuple(Meters.model_fields)


def meters_of(usage: SandboxUsage) -> dict[str, float | int]:
    """A sandbox's meters (its record keeps them under the same names)."""
    return {name: getattr(usage, name) for name in METERS}


class UsageTotals(Meters):
    sandboxes: int


def totals(usages: Iterable[SandboxUsage]) -> UsageTotals:
    listed = list(usages)
    summed = {name: sum(getattr(u, name) for u in listed) for name in METERS}
    return UsageTotals(sandboxes=len(listed), **summed)
