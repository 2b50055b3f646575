"""The scheduler pulls its durables in batches (shared/bus/batches.py). On a real nats-server:

- a batch redelivered after part (or all) of it was handled changes nothing in effect: every
  sandbox still gets exactly one schedule and, at its deadline, exactly one command;
- two replicas share the work, and when one is killed with SIGKILL the other fires its deadlines
  (its unacked batch comes back after ``ack_wait``), each once;
- no task per deadline: the scheduler holds no timers (NATS does), so its tasks do not grow with
  the number of deadlines;
- a flood of events for sandboxes with absurd records (far future, long past, garbage) leaves the
  others' schedules alone.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import nats
import pytest

from services.scheduler import plans
from services.scheduler.handlers import SchedulerHandlers
from shared.bus import subjects
from shared.bus.batches import BatchConsumer, BatchHandler, Delivery, Outcome
from shared.bus.broker import make_broker
from shared.bus.publishing import BrokerPublisher
from shared.bus.records import bucket_version
from shared.bus.retry import Retry
from shared.bus.timers import MAX_AHEAD, NatsTimers
from shared.bus.topology import (
    KV_SANDBOXES,
    SCHEDULER_FIRED,
    SCHEDULER_LIFECYCLE,
    STREAM_DLQ,
    STREAM_EVT,
    STREAM_TIMERS,
)
from shared.models.messages import SandboxCreated
from shared.settings import BusSettings, FeatureFlags
from tests.scheduler.conftest import Bus, StartScheduler, now


async def _count(bus: Bus, stream: str, subject_filter: str) -> int:
    info = await bus.js.stream_info(stream, subjects_filter=subject_filter)
    return sum((info.state.subjects or {}).values())


async def _pending_schedules(bus: Bus) -> int:
    return await _count(bus, STREAM_TIMERS, "sandbox.sched.timeout.>")


async def _until(predicate: Any, *, within: float) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not await predicate():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.1)


async def _commands(bus: Bus, *, expect: int, within: float, linger: float = 1.0) -> list[str]:
    """The sandbox id of every command published, in batches (``Bus.commands`` pulls one at a
    time): until ``expect`` arrived and ``linger`` more seconds brought no duplicate, or
    ``within`` seconds passed."""
    got: list[str] = []
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    quiet_from: float | None = None
    while loop.time() < end:
        fetched = 0
        for sub in bus._subs:
            try:
                msgs = await sub.fetch(200, timeout=0.2)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            for m in msgs:
                await m.ack()
                got.append(subjects.sandbox_id_of(m.subject))
            fetched += len(msgs)
        if len(got) >= expect:
            quiet_from = quiet_from or loop.time()
            if fetched == 0 and loop.time() - quiet_from >= linger:
                break
    return got


def _assert_each_fired_once(got: Sequence[str], sids: Sequence[str]) -> None:
    per_sandbox = Counter(got)
    assert sorted(per_sandbox) == sorted(sids)
    assert set(per_sandbox.values()) == {1}, per_sandbox.most_common(3)


# ---- a redelivered batch ------------------------------------------------------------------------


class Crashing:
    """Handles part of its first batch (or all of it), then fails the whole batch before any ack:
    what a replica that dies mid-batch leaves behind, without waiting for ``ack_wait``."""

    def __init__(self, handle: BatchHandler, *, share: float) -> None:
        self._handle = handle
        self._share = share
        self.crashed = 0

    async def __call__(self, batch: Sequence[Delivery]) -> Sequence[Outcome]:
        if self.crashed == 0 and len(batch) > 1:
            self.crashed = len(batch)
            await self._handle(batch[: int(len(batch) * self._share)])
            raise Retry("crashed before the acks", delay=0.2)
        return await self._handle(batch)


@pytest.fixture
async def in_process(bus: Bus) -> AsyncIterator[SchedulerHandlers]:
    broker = make_broker(BusSettings(NATS_URL=bus.url), service="scheduler")
    await broker.connect()
    handlers = SchedulerHandlers(
        store=bus.store,
        publisher=BrokerPublisher(broker),
        timers=NatsTimers(bus.js),
        flags=FeatureFlags(PAUSE_RESUME="true"),
        policy=plans.Policy(
            retention=timedelta(hours=1),
            pause_check=timedelta(seconds=60),
            pause_attempts=3,
        ),
        records_version=partial(bucket_version, bus.js, KV_SANDBOXES),
    )
    yield handlers
    await broker.stop()


async def test_a_batch_redelivered_after_part_of_it_was_handled_fires_each_deadline_once(
    bus: Bus, in_process: SchedulerHandlers
) -> None:
    sids = [f"sbx-b{i:03d}" for i in range(120)]
    for i, sid in enumerate(sids):
        await bus.put(sid, timeout=2 + i % 3, auto_pause=i % 2 == 0)
    arming = Crashing(in_process.on_event_batch, share=0.5)
    firing = Crashing(in_process.on_fired_batch, share=1.0)  # commands out, then no ack
    consumers = [
        BatchConsumer(bus.js, SCHEDULER_LIFECYCLE, arming, batch=50, wait=0.2),
        BatchConsumer(bus.js, SCHEDULER_FIRED, firing, batch=50, wait=0.2),
    ]
    for c in consumers:
        await c.start()
    try:
        got = await _commands(bus, expect=len(sids), within=30)
    finally:
        for c in consumers:
            await c.stop()
    assert arming.crashed and firing.crashed  # both paths really were redelivered
    _assert_each_fired_once(got, sids)
    assert await _count(bus, STREAM_EVT, "sandbox.evt.expired.>") == len(sids)


# ---- two replicas, one killed -------------------------------------------------------------------


@pytest.mark.slow
async def test_two_replicas_share_the_work_and_a_killed_ones_deadlines_still_fire_once(
    bus: Bus, scheduler_process: Any
) -> None:
    small = {"PAUSE_RESUME": "true", "TORPOR_TUNING": "SCHEDULER_FETCH_BATCH=10"}
    replicas = [scheduler_process(**small), scheduler_process(**small)]
    for r in replicas:
        await r.wait_ready(timeout=60)  # a loaded machine starts Python slowly
    sids = [f"sbx-d{i:03d}" for i in range(160)]
    for i, sid in enumerate(sids):
        await bus.put(sid, timeout=3 + i % 5, auto_pause=i % 2 == 0)
    await _until(lambda: _pending_or_fired(bus, len(sids)), within=20)
    armed = [await r.metric("torpor_scheduler_timers_armed_total") for r in replicas]
    assert all(a > 0 for a in armed), armed  # both replicas took a share
    replicas[0].kill9()  # with deadlines still to come; its unacked batches come back
    # Its unacked batches come back after ack_wait (10 s).
    got = await _commands(bus, expect=len(sids), within=40, linger=2.0)
    _assert_each_fired_once(got, sids)
    assert await _count(bus, STREAM_EVT, "sandbox.evt.expired.>") == len(sids)


async def _pending_or_fired(bus: Bus, n: int) -> bool:
    armed = await _pending_schedules(bus)
    expired = await _count(bus, STREAM_EVT, "sandbox.evt.expired.>")
    return armed + expired >= n


# ---- bounded -----------------------------------------------------------------------------------


async def test_no_task_and_no_timer_per_deadline(bus: Bus, start_scheduler: StartScheduler) -> None:
    await start_scheduler()
    await asyncio.sleep(0.3)  # its consumers are up and idle
    before = len(asyncio.all_tasks())
    n = 400
    for i in range(n):
        await bus.put(f"sbx-m{i:03d}", timeout=3600, announce=False)
    await asyncio.gather(
        *(
            bus.event(
                SandboxCreated(sandbox_id=f"sbx-m{i:03d}", generation=1, at=now()),
                subjects.EVT_CREATED,
            )
            for i in range(n)
        )
    )
    await _until(lambda: _pending_schedules_are(bus, n), within=30)
    await _until(lambda: _consumer_idle(bus), within=30)  # every event acked
    # The deadlines wait in NATS; the scheduler's own tasks are its consumers, not its timers.
    assert len(asyncio.all_tasks()) <= before + 4


async def _consumer_idle(bus: Bus) -> bool:
    info = await bus.js.consumer_info(SCHEDULER_LIFECYCLE.stream, SCHEDULER_LIFECYCLE.name)
    return bool(info.num_pending == 0 and info.num_ack_pending == 0)


async def _pending_schedules_are(bus: Bus, n: int) -> bool:
    return await _pending_schedules(bus) == n


# ---- hostile records --------------------------------------------------------------------------


async def test_a_flood_of_absurd_records_leaves_the_other_schedules_alone(
    bus: Bus, start_scheduler: StartScheduler
) -> None:
    await start_scheduler()
    at = now()
    normal = [await bus.put(f"sbx-ok{i:02d}", timeout=3600, announce=False) for i in range(30)]
    kv = await bus.js.key_value(KV_SANDBOXES)
    far = normal[0].model_copy(
        update={"sandbox_id": "sbx-far", "deadline": at.replace(year=9999), "timeout": 2**31}
    )
    past = normal[0].model_copy(
        update={"sandbox_id": "sbx-past", "deadline": at - timedelta(days=9000), "timeout": 1}
    )
    for record in (far, past):
        await kv.put(record.sandbox_id, record.model_dump_json().encode())
    template = json.loads(normal[0].model_dump_json())
    hostile = {
        "sbx-nan": {**template, "sandbox_id": "sbx-nan", "deadline": "NaN"},
        "sbx-huge": {**template, "sandbox_id": "sbx-huge", "timeout": 10**30},
        "sbx-null": {**template, "sandbox_id": "sbx-null", "state": "--ro-bind\x00"},
    }
    for sid, body in hostile.items():
        await kv.put(sid, json.dumps(body).encode())
    await kv.put("sbx-junk", b"\x00\xff not a record")
    flood = [r.sandbox_id for r in normal] + ["sbx-far", "sbx-past", "sbx-junk", *hostile]
    flood += [f"sbx-none{i}" for i in range(20)]  # events for sandboxes that do not exist
    for _ in range(3):  # the same events again (a replayed stream)
        await asyncio.gather(
            *(
                bus.event(SandboxCreated(sandbox_id=sid, generation=1, at=at), subjects.EVT_CREATED)
                for sid in flood
            )
        )

    async def normal_armed() -> bool:
        for r in normal:
            found = await bus.js.get_last_msg(
                STREAM_TIMERS, subjects.of(subjects.SCHED_TIMEOUT, r.sandbox_id)
            )
            if json.loads(found.data or b"{}")["due"] != r.model_dump(mode="json")["deadline"]:
                return False
        return True

    await _until(_quietly(normal_armed), within=30)
    # The long-past deadline expires at once; the unreadable records are dead-lettered.
    assert await _commands(bus, expect=1, within=10) == ["sbx-past"]
    await _until(lambda: _dead_letters_at_least(bus, 4), within=30)
    # Year 9999 is armed at most 7 days ahead (nats-server fires a schedule centuries away at
    # once, which would loop: fire, "moved", re-arm, fire...): it waits, unfired.
    far_holder = await bus.js.get_last_msg(
        STREAM_TIMERS, subjects.of(subjects.SCHED_TIMEOUT, "sbx-far")
    )
    at_header = (far_holder.headers or {})["Nats-Schedule"].removeprefix("@at ")
    assert now() + timedelta(days=6) < datetime.fromisoformat(at_header) <= now() + MAX_AHEAD
    assert await _count(bus, STREAM_TIMERS, subjects.of(subjects.TIMER_FIRED, "sbx-far")) == 0
    # ...and the scheduler still arms a sandbox that comes after the flood.
    late = await bus.put("sbx-after", timeout=3600)

    async def late_armed() -> bool:
        found = await bus.js.get_last_msg(
            STREAM_TIMERS, subjects.of(subjects.SCHED_TIMEOUT, "sbx-after")
        )
        return bool(
            json.loads(found.data or b"{}")["due"] == late.model_dump(mode="json")["deadline"]
        )

    await _until(_quietly(late_armed), within=30)


def _quietly(check: Any) -> Any:
    async def run() -> bool:
        try:
            return bool(await check())
        except Exception:  # not armed yet
            return False

    return run


async def _dead_letters_at_least(bus: Bus, n: int) -> bool:
    return await _count(bus, STREAM_DLQ, ">") >= n
