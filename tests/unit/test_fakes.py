"""The fakes keep the adapters' promises (tests of other code rely on them), and the unit tier
really has no processes or connections."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from datetime import UTC, datetime, timedelta

import pytest

from shared.bus.schedules import Timer
from shared.domain.record import SandboxRecord
from shared.domain.states import SandboxState
from shared.errors import Conflict, NotFound
from shared.models.messages import PauseSandbox
from tests.fakes.clock import FakeClock
from tests.fakes.publisher import RecordingPublisher
from tests.fakes.store import InMemorySandboxStore
from tests.fakes.timers import FakeTimers

pytestmark = pytest.mark.unit

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def rec(sid: str = "sbx1", **kw: object) -> SandboxRecord:
    base: dict[str, object] = {
        "sandbox_id": sid,
        "owner": "alice",
        "state": SandboxState.RUNNING,
        "created_at": T0,
        "started_at": T0,
        "updated_at": T0,
    }
    return SandboxRecord.model_validate({**base, **kw})


async def test_store_revisions_are_one_sequence_and_cas_refuses_a_stale_one() -> None:
    store = InMemorySandboxStore(clock=FakeClock(T0))
    await store.create(rec("a"))
    await store.create(rec("b"))
    assert (store.revision("a"), store.revision("b")) == (1, 2)
    with pytest.raises(Conflict):
        await store.create(rec("a"))
    with pytest.raises(Conflict):
        store.compare_and_set(rec("a", generation=5), last=2)
    assert store.compare_and_set(rec("a", generation=5), last=1) == 3
    with pytest.raises(NotFound):
        await store.update("nope", lambda r: r)


async def test_store_update_rereads_after_a_lost_race() -> None:
    store = InMemorySandboxStore()
    await store.create(rec(generation=1))
    store.race = lambda: store.put(rec(generation=7))  # another writer between read and CAS
    seen: list[int] = []

    def bump(r: SandboxRecord) -> SandboxRecord:
        seen.append(r.generation)
        return r.model_copy(update={"generation": r.generation + 1})

    new = await store.update("sbx1", bump)
    assert seen == [1, 7] and new.generation == 8 and store.lost_races == 1
    assert (await store.get("sbx1")) == new


async def test_store_wait_for_wakes_on_a_write_and_times_out_otherwise() -> None:
    store = InMemorySandboxStore()
    await store.create(rec())
    waiter = asyncio.create_task(
        store.wait_for("sbx1", lambda r: r.state == SandboxState.PAUSED, timeout=5)
    )
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await store.update("sbx1", lambda r: r.model_copy(update={"state": SandboxState.PAUSED}))
    assert (await waiter).state == SandboxState.PAUSED
    with pytest.raises(TimeoutError):
        await store.wait_for("sbx1", lambda r: False, timeout=0.05)
    await store.delete("sbx1")
    with pytest.raises(NotFound):
        await store.wait_for("sbx1", lambda r: True, timeout=1)


async def test_publisher_drops_a_repeated_message_id_like_jetstream() -> None:
    publisher = RecordingPublisher()
    cmd = PauseSandbox(sandbox_id="sbx1", generation=1)
    assert await publisher.publish(cmd, "sandbox.cmd.pause.sbx1", msg_id="pause:sbx1:g1")
    assert not await publisher.publish(cmd, "sandbox.cmd.pause.sbx1", msg_id="pause:sbx1:g1")
    assert await publisher.publish(cmd, "sandbox.cmd.pause.sbx1", msg_id="pause:sbx1:g1:a2")
    assert [p.msg_id for p in publisher.published] == ["pause:sbx1:g1", "pause:sbx1:g1:a2"]
    assert len(publisher.duplicates) == 1
    publisher.fail_with = ConnectionError("bus down")
    with pytest.raises(ConnectionError):
        await publisher.publish(cmd, "sandbox.cmd.pause.sbx1", msg_id="pause:sbx1:g9")
    assert len(publisher.published) == 2


async def test_timers_hold_one_per_holder_and_fire_when_due() -> None:
    timers = FakeTimers()
    clock = FakeClock(T0)

    def timer(kind: str, due: float) -> Timer:
        return Timer.model_validate(
            {
                "kind": kind,
                "sandbox_id": "sbx1",
                "generation": 1,
                "due": T0 + timedelta(seconds=due),
            }
        )

    await timers.arm(timer("timeout", 10))
    await timers.arm(timer("pause_check", 20))  # same holder: replaces the timeout
    await timers.arm(timer("retention", 5))
    assert (await timers.pending("sbx1", "timeout")) == timer("pause_check", 20)
    assert timers.due(clock.advance(5)) == [timer("retention", 5)]
    assert timers.due(clock.advance(10)) == []
    await timers.cancel("sbx1", "timeout")
    assert timers.due(clock.advance(100)) == [] and timers.next_due() is None


def test_unit_tests_cannot_start_processes_or_connect() -> None:
    with pytest.raises(AssertionError, match="may not start a process"):
        subprocess.run(["true"], check=False)
    with pytest.raises(AssertionError, match="may not open a connection"), socket.socket() as s:
        s.connect(("127.0.0.1", 4222))
