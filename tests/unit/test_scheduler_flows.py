"""The scheduler's handlers in memory: records in the in-memory store, events handed to
``on_event``, timers fired by a fake clock into ``on_fired``, commands caught by the recording
publisher. The same flows run on a real nats-server in tests/scheduler/test_expiry_flow.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest
from pydantic import BaseModel, ValidationError

from services.scheduler import plans
from services.scheduler.handlers import SchedulerHandlers
from shared.bus import subjects
from shared.domain.record import SandboxRecord
from shared.domain.states import SandboxState
from shared.models.lifecycle import HookOutcome
from shared.models.messages import (
    KillSandbox,
    PauseSandbox,
    SandboxActivity,
    SandboxCreated,
    SandboxExpired,
    SandboxFailed,
    SandboxPaused,
)
from shared.settings import FeatureFlags
from tests.fakes.clock import FakeClock
from tests.fakes.publisher import RecordingPublisher
from tests.fakes.records import paused_without_retention, running_record
from tests.fakes.store import InMemorySandboxStore
from tests.fakes.timers import FakeTimers

pytestmark = pytest.mark.unit


@dataclass
class Scheduler:
    clock: FakeClock
    store: InMemorySandboxStore
    publisher: RecordingPublisher
    timers: FakeTimers
    handlers: SchedulerHandlers

    async def put(
        self,
        sid: str,
        *,
        owner: str = "alice",
        timeout: int = 2,
        auto_pause: bool = True,
        auto_pause_memory: bool = False,
    ) -> SandboxRecord:
        """A running sandbox whose full timeout starts now, announced (what the scaler does)."""
        at = self.clock()
        record = running_record(sid, at=at, owner=owner, timeout=timeout, auto_pause=auto_pause)
        record = record.model_copy(update={"auto_pause_memory": auto_pause_memory})
        await self.store.create(record)
        await self.event(SandboxCreated(sandbox_id=sid, generation=1, at=at))
        return record

    async def event(self, message: BaseModel) -> str:
        kind = message.type  # type: ignore[attr-defined]
        subject = subjects.of(kind, message.sandbox_id)  # type: ignore[attr-defined]
        return await self.handlers.on_event(subject, message.model_dump_json().encode())

    async def run(self, seconds: float) -> list[str]:
        """Let ``seconds`` pass, firing every timer when it is due; the outcomes in order."""
        end = self.clock() + timedelta(seconds=seconds)
        outcomes: list[str] = []
        while (due := self.timers.next_due()) is not None and due <= end:
            self.clock.advance(max(0.0, (due - self.clock()).total_seconds()))
            for timer in self.timers.due(self.clock()):
                outcomes.append(await self.handlers.on_fired(timer.model_dump_json().encode()))
        self.clock.advance(max(0.0, (end - self.clock()).total_seconds()))
        return outcomes

    def commands(self) -> list[tuple[str, str]]:
        return [(p.verb, p.msg_id) for p in self.publisher.published if ".cmd." in p.subject]


def scheduler(
    *, pause_resume: str = "true", pause_check: float = 30, attempts: int = 4, retention: int = 3600
) -> Scheduler:
    clock = FakeClock()
    store = InMemorySandboxStore(clock=clock)
    publisher = RecordingPublisher()
    timers = FakeTimers()
    handlers = SchedulerHandlers(
        store=store,
        publisher=publisher,
        timers=timers,
        flags=FeatureFlags(PAUSE_RESUME=pause_resume),
        policy=plans.Policy(
            retention=timedelta(seconds=retention),
            pause_check=timedelta(seconds=pause_check),
            pause_attempts=attempts,
        ),
        clock=clock,
    )
    return Scheduler(clock, store, publisher, timers, handlers)


async def test_flag_on_and_auto_pause_pauses_at_the_deadline() -> None:
    s = scheduler(pause_resume="alice")
    record = await s.put("sbx-on", timeout=2)
    assert await s.run(1.9) == []
    assert await s.run(0.1) == ["expired"]
    assert s.commands() == [("pause", "pause:sbx-on:g1")]  # the API's id for this generation
    (pause,) = s.publisher.of_type(PauseSandbox)
    assert pause.reason == "timeout"
    assert pause.memory is False  # created without autoPauseMemory: files only
    (expired,) = s.publisher.of_type(SandboxExpired)
    assert (expired.decision, expired.deadline) == ("pause", record.deadline)
    assert expired.command == "sandbox.cmd.pause.sbx-on pause:sbx-on:g1"
    check = await s.timers.pending("sbx-on", "timeout")
    assert check is not None and check.kind == "pause_check"


@pytest.mark.parametrize(("flag", "auto_pause"), [("bob,carol", True), ("true", False)])
async def test_otherwise_the_deadline_kills(flag: str, auto_pause: bool) -> None:
    s = scheduler(pause_resume=flag)
    await s.put("sbx-k", timeout=1, auto_pause=auto_pause)
    assert await s.run(1) == ["expired"]
    assert s.commands() == [("kill", "kill:sbx-k:g1")]
    assert s.publisher.of_type(KillSandbox)[0].reason == "timeout"
    assert await s.timers.pending("sbx-k", "timeout") is None


async def test_activity_moves_the_deadline_lazily_and_keeps_it_running() -> None:
    s = scheduler()
    await s.put("sbx-busy", timeout=2)
    for _ in range(6):
        await s.run(1)
        assert await s.event(
            SandboxActivity(sandbox_id="sbx-busy", generation=1, at=s.clock())
        ) in {"extended", "unchanged"}
    assert s.commands() == []
    record = await s.store.get("sbx-busy")
    assert record is not None and record.deadline == s.clock() + timedelta(seconds=2)
    # Activity wrote only the record; the old schedule fired early and re-armed ("moved").
    assert len(s.timers.armed) >= 2
    assert all(t.kind == "timeout" for t in s.timers.armed)
    # Quiet from now on: the next fire is early once more (re-arms), then it expires.
    assert await s.run(2) == ["moved", "expired"]
    assert s.commands() == [("pause", "pause:sbx-busy:g1")]


async def test_a_pause_that_never_happens_is_retried_then_the_sandbox_is_killed() -> None:
    s = scheduler(pause_check=0.5, attempts=2)
    await s.put("sbx-stuck", timeout=1)
    await s.run(10)  # nobody pauses it: the snapshotter is "down"
    assert s.commands() == [
        ("pause", "pause:sbx-stuck:g1"),
        ("pause", "pause:sbx-stuck:g1:a2"),
        ("kill", "kill:sbx-stuck:g1"),
    ]
    assert [e.decision for e in s.publisher.of_type(SandboxExpired)] == ["pause", "kill"]


async def test_a_timeout_pause_keeps_memory_when_the_sandbox_was_created_asking_for_it() -> None:
    s = scheduler(pause_check=0.5, attempts=2)
    await s.put("sbx-mem", timeout=1, auto_pause_memory=True)
    await s.run(10)  # nobody pauses it: the first pause and its retry both ask for memory
    assert [c for c, _ in s.commands()] == ["pause", "pause", "kill"]
    assert [p.memory for p in s.publisher.of_type(PauseSandbox)] == [True, True]


async def test_a_refused_timeout_pause_arms_the_timeout_again() -> None:
    """A prePause abort refused the pause (running, generation+1, a fresh deadline): the pause
    check held the sandbox's only timer, so it must arm the timeout again, or the sandbox would
    never expire (docs/lifecycle-hooks.md)."""
    s = scheduler(pause_check=5)
    await s.put("sbx-refused", timeout=1)
    assert await s.run(1) == ["expired"]
    refused = HookOutcome(hook="prePause", source="sandbox", policy="abort", ok=False)

    def refuse(r: SandboxRecord) -> SandboxRecord:  # what pause_refused writes
        deadline = s.clock() + timedelta(seconds=1)
        update = {"generation": 2, "deadline": deadline, "refused_pause": refused}
        return r.model_copy(update=update)

    await s.store.update("sbx-refused", refuse)
    assert await s.run(5) == ["refused", "expired"]  # the check re-arms; the deadline expires
    assert s.commands() == [("pause", "pause:sbx-refused:g1"), ("pause", "pause:sbx-refused:g2")]


async def test_a_failed_timeout_pause_gets_the_sandbox_killed_at_once() -> None:
    s = scheduler(pause_check=30)
    await s.put("sbx-fail", timeout=1)
    await s.run(1)
    assert s.commands() == [("pause", "pause:sbx-fail:g1")]

    def fail(r: SandboxRecord) -> SandboxRecord:  # what the snapshotter's give_up writes
        update = {"state": SandboxState.FAILED, "generation": 2, "failure": "pause: too large"}
        return r.model_copy(update=update)

    await s.store.update("sbx-fail", fail)
    outcome = await s.event(
        SandboxFailed(sandbox_id="sbx-fail", generation=2, at=s.clock(), op="pause", reason="x")
    )
    assert outcome == "pause_failed"  # not after the 30 s check: at once
    assert s.commands()[-1] == ("kill", "kill:sbx-fail:g2")


async def test_a_failed_user_pause_is_left_alone() -> None:
    s = scheduler()
    await s.put("sbx-user", timeout=600)
    await s.store.update(
        "sbx-user",
        lambda r: r.model_copy(update={"state": SandboxState.FAILED, "failure": "pause: x"}),
    )
    failed = SandboxFailed(sandbox_id="sbx-user", generation=1, at=s.clock(), op="pause", reason="")
    assert await s.event(failed) == "not_ours"
    assert s.commands() == []


async def test_retention_kills_an_old_paused_sandbox_and_records_when() -> None:
    s = scheduler(retention=2)
    await s.put("sbx-old", timeout=600)
    paused_at = s.clock()
    await s.store.update("sbx-old", paused_without_retention(paused_at, generation=2))
    assert await s.event(SandboxPaused(sandbox_id="sbx-old", generation=2, at=paused_at)) == (
        "retained"
    )
    record = await s.store.get("sbx-old")
    assert record is not None and record.retain_until == paused_at + timedelta(seconds=2)
    assert ("sbx-old", "timeout") in s.timers.cancelled
    assert await s.run(2) == ["retention_expired"]
    assert s.commands() == [("kill", "kill:sbx-old:g2")]
    assert s.publisher.of_type(KillSandbox)[0].reason == "retention"


async def test_a_timer_fired_twice_publishes_nothing_new() -> None:
    s = scheduler()
    await s.put("sbx-twice", timeout=1)
    s.clock.advance(1)
    (timer,) = s.timers.due(s.clock())
    body = timer.model_dump_json().encode()
    assert await s.handlers.on_fired(body) == "expired"
    await s.handlers.on_fired(body)  # redelivery, or a second replica
    assert s.commands() == [("pause", "pause:sbx-twice:g1")]


async def test_gone_sandboxes_cancel_their_timers() -> None:
    s = scheduler()
    await s.put("sbx-gone", timeout=60)
    await s.store.delete("sbx-gone")
    assert await s.run(60) == ["gone"]
    assert {("sbx-gone", "timeout"), ("sbx-gone", "retention")} <= set(s.timers.cancelled)


@pytest.mark.parametrize("body", [b"", b"{}", b"\x00", b'{"kind": "--ro-bind"}', b"[" * 10_000])
async def test_malformed_timer_bodies_raise_a_validation_error(body: bytes) -> None:
    # The bus middleware dead-letters a ValidationError (tests/foundation/test_retry_dlq.py).
    with pytest.raises(ValidationError):
        await scheduler().handlers.on_fired(body)
