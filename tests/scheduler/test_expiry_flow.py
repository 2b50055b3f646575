"""Expiry through a real nats-server: records in KV, events on the bus, commands on SANDBOX_CMD."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

from shared.bus import subjects
from shared.bus.schedules import holder_subject
from shared.bus.topology import STREAM_TIMERS
from shared.domain.record import SandboxRecord
from shared.domain.states import SandboxState
from shared.models.messages import SandboxActivity, SandboxFailed, SandboxTimeoutSet
from tests.fakes.records import paused_without_retention
from tests.scheduler.conftest import Bus, StartScheduler, now


async def _expired_events(bus: Bus, sandbox_id: str) -> list[dict[str, object]]:
    sub = await bus.js.subscribe(
        subjects.of(subjects.EVT_EXPIRED, sandbox_id), ordered_consumer=True
    )
    out: list[dict[str, object]] = []
    try:
        while True:
            msg = await sub.next_msg(timeout=0.5)
            out.append(json.loads(msg.data))
    except Exception:
        pass
    await sub.unsubscribe()
    return out


async def test_flag_on_and_auto_pause_pauses_within_two_seconds_of_the_deadline(
    bus: Bus, start_scheduler: StartScheduler
) -> None:
    await start_scheduler(pause_resume="alice")
    record = await bus.put("sbx-on", owner="alice", timeout=2, auto_pause=True)
    cmd = await bus.next_command(timeout=8)
    assert cmd is not None
    assert cmd.subject == "sandbox.cmd.pause.sbx-on"
    assert cmd.body["reason"] == "timeout"
    assert cmd.msg_id == "pause:sbx-on:g1"  # the id the API uses for the same generation
    assert record.deadline is not None
    late = (cmd.stored_at - record.deadline).total_seconds()
    assert 0 <= late < 2.0, late
    events = await _expired_events(bus, "sbx-on")
    assert [(e["decision"], e["generation"]) for e in events] == [("pause", 1)]


async def test_flag_off_for_the_user_kills(bus: Bus, start_scheduler: StartScheduler) -> None:
    await start_scheduler(pause_resume="bob,carol")
    await bus.put("sbx-off", owner="alice", timeout=1, auto_pause=True)
    cmd = await bus.next_command(timeout=8)
    assert cmd is not None
    assert cmd.subject == "sandbox.cmd.kill.sbx-off"
    assert cmd.body["reason"] == "timeout"
    assert [e["decision"] for e in await _expired_events(bus, "sbx-off")] == ["kill"]


async def test_without_auto_pause_kills_even_with_the_flag_on(
    bus: Bus, start_scheduler: StartScheduler
) -> None:
    await start_scheduler(pause_resume="true")
    await bus.put("sbx-nopause", owner="alice", timeout=1, auto_pause=False)
    cmd = await bus.next_command(timeout=8)
    assert cmd is not None
    assert cmd.subject == "sandbox.cmd.kill.sbx-nopause"


async def test_activity_every_second_keeps_it_running(
    bus: Bus, start_scheduler: StartScheduler
) -> None:
    await start_scheduler(pause_resume="true")
    await bus.put("sbx-busy", timeout=2)
    # Half the time as activity events only (touch as an event), half as deadline writes only
    # (touch as a KV update): both must keep it alive.
    last = now()
    for i in range(6):
        await asyncio.sleep(1)
        last = now()
        if i % 2 == 0:
            await bus.event(
                SandboxActivity(sandbox_id="sbx-busy", generation=1, at=now()),
                subjects.EVT_ACTIVITY,
            )
        else:
            await bus.store.update(
                "sbx-busy",
                lambda r: r.model_copy(update={"deadline": now() + timedelta(seconds=2)}),
            )
        assert await bus.next_command(timeout=0.01) is None
    cmd = await bus.command("pause", timeout=6)  # activity stopped: it expires about 2 s later
    assert 1.9 < (cmd.stored_at - last).total_seconds() < 4.0


async def test_set_timeout_may_shorten_the_deadline(
    bus: Bus, start_scheduler: StartScheduler
) -> None:
    await start_scheduler(pause_resume="true")
    await bus.put("sbx-short", timeout=60)
    await asyncio.sleep(0.5)
    rec = await bus.store.update(
        "sbx-short",
        lambda r: r.model_copy(update={"timeout": 1, "deadline": now() + timedelta(seconds=1)}),
    )
    assert rec.deadline is not None
    await bus.event(
        SandboxTimeoutSet(sandbox_id="sbx-short", generation=1, at=now(), deadline=rec.deadline),
        subjects.EVT_TIMEOUT_SET,
    )
    cmd = await bus.command("pause", timeout=5)
    assert (cmd.stored_at - rec.deadline).total_seconds() < 2.0


async def test_resume_after_expiry_pause_starts_a_new_full_timeout(
    bus: Bus, start_scheduler: StartScheduler
) -> None:
    await start_scheduler(pause_resume="true", retention_seconds=3600)
    await bus.put("sbx-cycle", timeout=3)
    await bus.command("pause", timeout=8)
    paused = await bus.complete_pause("sbx-cycle", retention=timedelta(hours=1))
    await asyncio.sleep(0.5)  # the scheduler swaps the timeout holder for the retention one
    info = await bus.js.stream_info(STREAM_TIMERS, subjects_filter="sandbox.sched.>")
    assert set((info.state.subjects or {}).keys()) == {holder_subject("retention", "sbx-cycle")}
    assert await bus.next_command(timeout=3) is None  # paused: no timeout while paused
    resumed = await bus.complete_resume("sbx-cycle")
    assert resumed.generation == paused.generation + 1
    second = await bus.command("pause", timeout=8)
    assert second.msg_id == f"pause:sbx-cycle:g{resumed.generation}"
    assert resumed.deadline is not None
    waited = (second.stored_at - resumed.started_at).total_seconds()
    assert 3.0 <= waited < 5.0, waited  # a full new timeout, counted from the resume
    record = await bus.store.get("sbx-cycle")
    assert record is not None
    assert record.retain_until is None


async def test_a_pause_that_never_happens_is_retried_then_the_sandbox_is_killed(
    bus: Bus, start_scheduler: StartScheduler
) -> None:
    await start_scheduler(pause_resume="true", pause_check_seconds=0.5, pause_attempts=2)
    await bus.put("sbx-stuck", timeout=1)
    got = await bus.commands(within=6)  # nobody pauses it: the snapshotter is "down"
    assert [(c.verb, c.msg_id) for c in got] == [
        ("pause", "pause:sbx-stuck:g1"),
        ("pause", "pause:sbx-stuck:g1:a2"),
        ("kill", "kill:sbx-stuck:g1"),
    ]
    assert got[2].body["reason"] == "timeout"
    decisions = [e["decision"] for e in await _expired_events(bus, "sbx-stuck")]
    assert decisions == ["pause", "kill"]


async def test_a_failed_timeout_pause_gets_the_sandbox_killed(
    bus: Bus, start_scheduler: StartScheduler
) -> None:
    await start_scheduler(pause_resume="true", pause_check_seconds=30)
    await bus.put("sbx-fail", timeout=1)
    await bus.command("pause", timeout=6)

    def fail(r: SandboxRecord) -> SandboxRecord:  # what the snapshotter's give_up writes
        return r.model_copy(
            update={
                "state": SandboxState.FAILED,
                "generation": r.generation + 1,
                "failure": "pause: snapshot too large",
            }
        )

    rec = await bus.store.update("sbx-fail", fail)
    await bus.event(
        SandboxFailed(
            sandbox_id="sbx-fail", generation=rec.generation, at=now(), op="pause", reason="x"
        ),
        subjects.EVT_FAILED,
    )
    kill = await bus.next_command(timeout=3)  # not after the 30 s check: at once
    assert kill is not None
    assert (kill.verb, kill.msg_id) == ("kill", f"kill:sbx-fail:g{rec.generation}")


async def test_retention_deletes_an_old_paused_sandbox(
    bus: Bus, start_scheduler: StartScheduler
) -> None:
    await start_scheduler(pause_resume="true", retention_seconds=2)
    await bus.put("sbx-old", timeout=600, announce=False)
    # Paused by the scaler without a retain_until: the scheduler computes and records it.
    at = now()
    await bus.store.update("sbx-old", paused_without_retention(at, generation=2))
    from shared.models.messages import SandboxPaused

    await bus.event(SandboxPaused(sandbox_id="sbx-old", generation=2, at=at), subjects.EVT_PAUSED)
    cmd = await bus.next_command(timeout=8)
    assert cmd is not None
    assert (cmd.verb, cmd.body["reason"], cmd.msg_id) == ("kill", "retention", "kill:sbx-old:g2")
    record = await bus.store.get("sbx-old")
    assert record is not None
    assert record.retain_until == at + timedelta(seconds=2)
    assert cmd.stored_at >= record.retain_until
