"""The usage ledger's arithmetic and its exactly-once rule, with fakes: a scripted lifecycle
gives the exact seconds, duplicates (redelivered, re-published) change nothing, sizes weigh."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client import REGISTRY

from services.ledger.metering import Ledger
from shared.domain.record import SandboxRecord
from shared.models.messages import (
    ProcessOutcome,
    SandboxCreated,
    SandboxFailed,
    SandboxKilled,
    SandboxPaused,
    SandboxResumed,
)
from shared.models.usage import MIB, Size
from tests.fakes.store import InMemorySandboxStore
from tests.fakes.usage import InMemoryUsage

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SIZE = Size(cpu=2, memory_mb=512, kept_bytes=1024 * MIB)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


async def ledger() -> tuple[Ledger, InMemoryUsage]:
    records = InMemorySandboxStore()
    for sid, owner in (("s1", "alice"), ("s2", "alice"), ("s3", "bob")):
        await records.create(
            SandboxRecord(sandbox_id=sid, owner=owner, created_at=T0, started_at=T0, updated_at=T0)
        )
    usage = InMemoryUsage()
    return Ledger(records=records, usage=usage, size=SIZE), usage


class Stream:
    """Events as the stream stores them: subject, body, message id, sequence."""

    def __init__(self, led: Ledger) -> None:
        self.led = led
        self.seq = 0

    async def send(self, event: object, *, again: int | None = None) -> str:
        if again is None:
            self.seq += 1
        seq = again if again is not None else self.seq
        kind = str(event.type).rsplit(".", 1)[-1]  # type: ignore[attr-defined]
        sid, gen = event.sandbox_id, event.generation  # type: ignore[attr-defined]
        return await self.led.on_event(
            f"sandbox.evt.{kind}.{sid}",
            event.model_dump_json().encode(),  # type: ignore[attr-defined]
            msg_id=f"{kind}:{sid}:g{gen}",
            seq=seq,
        )


async def test_scripted_lifecycle_gives_exact_seconds() -> None:
    led, usage = await ledger()
    stream = Stream(led)
    await stream.send(SandboxCreated(sandbox_id="s1", generation=1, at=at(0)))
    await stream.send(SandboxPaused(sandbox_id="s1", generation=3, at=at(90)))
    await stream.send(
        SandboxResumed(
            sandbox_id="s1",
            generation=5,
            at=at(90 + 600),
            processes=[
                ProcessOutcome(cmd="a", args=[], old_pid=1, new_pid=2),
                ProcessOutcome(cmd="b", args=[], old_pid=3, error="exec failed"),
            ],
        )
    )
    await stream.send(SandboxKilled(sandbox_id="s1", generation=6, at=at(90 + 600 + 30.5)))
    (u, _) = usage.entries[("alice", "s1")]
    assert u.state == "stopped"
    assert u.running_seconds == 120.5
    assert u.paused_seconds == 600
    assert u.cpu_seconds == 241.0
    assert u.memory_mb_seconds == 120.5 * 512
    assert u.kept_byte_seconds == 600 * 1024 * MIB
    assert (u.resumes, u.replay_failures) == (1, 1)
    running = REGISTRY.get_sample_value("torpor_usage_running_seconds", {"user": "alice"})
    assert running is not None and running >= 120.5


async def test_duplicates_change_nothing() -> None:
    led, usage = await ledger()
    stream = Stream(led)
    created = SandboxCreated(sandbox_id="s2", generation=1, at=at(0))
    paused = SandboxPaused(sandbox_id="s2", generation=2, at=at(10))
    assert await stream.send(created) == "created"
    assert await stream.send(created, again=1) == "duplicate"  # redelivered: same sequence
    assert await stream.send(paused) == "paused"
    assert await stream.send(paused) == "duplicate"  # re-published: new sequence, same id
    assert await stream.send(SandboxKilled(sandbox_id="s2", generation=3, at=at(25))) == "killed"
    (u, _) = usage.entries[("alice", "s2")]
    assert (u.running_seconds, u.paused_seconds) == (10, 15)


async def test_a_failed_pause_keeps_counting_running_time_and_open_intervals_show_on_read() -> None:
    led, usage = await ledger()
    stream = Stream(led)
    await stream.send(SandboxCreated(sandbox_id="s3", generation=1, at=at(0)))
    await stream.send(
        SandboxFailed(sandbox_id="s3", generation=2, at=at(5), op="pause", reason="envd")
    )
    (u, _) = usage.entries[("bob", "s3")]
    assert u.state == "running" and u.running_seconds == 0
    now = u.as_of(at(42))
    assert now.running_seconds == 42 and now.cpu_seconds == 84
    assert u.running_seconds == 0  # reading does not store


async def test_unknown_sandbox_and_internal_facts_are_skipped() -> None:
    led, usage = await ledger()
    assert await led.on_event("sandbox.evt.created.nope", b"{}", msg_id="x", seq=1) == (
        "unattributed"
    )
    body = SandboxPaused(sandbox_id="s1", generation=1, at=T0).model_dump_json().encode()
    assert await led.on_event("sandbox.evt.activity.s1", body, msg_id="y", seq=2) == "ignored"
    assert usage.entries == {}
