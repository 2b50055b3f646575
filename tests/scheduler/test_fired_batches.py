"""Fired timers in batches, on a real nats-server: schedules fire ``lead`` early and each early
fire is held until it is due (``expiry.hold_for``), then decided on a fresh read of the record.

- never an expiry before the deadline, though the schedule fires a second ahead;
- a batch holding the same fire twice (a redelivery next to the original) publishes each event
  and command once;
- a record that changes while its fire is held is decided as it is then (paused: nothing;
  extended: re-armed, expired at the new deadline);
- a publish failing in the middle of a batch fails only its own message, which is redelivered
  and then publishes what is missing, nothing twice;
- two replicas pulling one set of fired timers: each expiry exactly once, both took a share.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import nats
import pytest
from pydantic import BaseModel

from services.scheduler import effects, plans
from services.scheduler.handlers import SchedulerHandlers
from shared.bus import subjects
from shared.bus.batches import BatchConsumer, Delivery, Outcome
from shared.bus.broker import make_broker
from shared.bus.publishing import BrokerPublisher
from shared.bus.schedules import Timer, fired_subject, holder_subject
from shared.bus.timers import NatsTimers
from shared.bus.topology import SCHEDULER_FIRED, STREAM_EVT, STREAM_TIMERS
from shared.domain.record import SandboxRecord
from shared.domain.states import SandboxState
from shared.errors import Unavailable
from shared.ports.bus import Publisher
from shared.settings import BusSettings, FeatureFlags
from tests.scheduler.conftest import Bus, now

LEAD = timedelta(seconds=2)  # the default


class FailingOnce:
    """A publisher whose first publish of each listed command fails (after its ``expired``
    event went out): what a broken connection in the middle of a batch does."""

    def __init__(self, inner: Publisher, commands: set[str]) -> None:
        self._inner = inner
        self._left = set(commands)
        self.failed: list[str] = []

    async def publish(self, message: BaseModel, subject: str, *, msg_id: str) -> bool:
        if subject in self._left:
            self._left.discard(subject)
            self.failed.append(subject)
            raise Unavailable(f"injected: could not publish {subject}")
        return await self._inner.publish(message, subject, msg_id=msg_id)


@dataclass
class Replica:
    handlers: SchedulerHandlers
    broker: Any
    handled: int = 0

    async def on_fired_batch(self, batch: Sequence[Delivery]) -> Sequence[Outcome]:
        self.handled += len(batch)
        return await self.handlers.on_fired_batch(batch)


@pytest.fixture
async def replicas(bus: Bus) -> AsyncIterator[Any]:
    """``await replicas(n, failing=...)``: in-process schedulers, each with its own connection."""
    made: list[Replica] = []

    async def make(n: int = 1, *, failing: set[str] | None = None) -> list[Replica]:
        for _ in range(n):
            broker = make_broker(BusSettings(NATS_URL=bus.url), service="scheduler")
            await broker.connect()
            publisher: Publisher = BrokerPublisher(broker)
            if failing is not None:
                publisher = FailingOnce(publisher, failing)
            js = broker.config.connection_state.stream
            handlers = SchedulerHandlers(
                store=bus.store,
                publisher=publisher,
                timers=NatsTimers(js, lead=LEAD),
                flags=FeatureFlags(PAUSE_RESUME="true"),
                policy=plans.Policy(
                    retention=timedelta(hours=1),
                    pause_check=timedelta(hours=1),
                    pause_attempts=3,
                ),
                lead=LEAD,
            )
            made.append(Replica(handlers, broker))
        return made[-n:]

    yield make
    for r in made:
        await r.broker.stop()


def _fire(sid: str, due: datetime) -> Delivery:
    """A fired timeout as the durable delivers it."""
    timer = Timer(kind="timeout", sandbox_id=sid, generation=1, due=due)
    return Delivery(fired_subject(sid), timer.model_dump_json().encode(), {}, 1)


def _deadline(record: SandboxRecord) -> datetime:
    assert record.deadline is not None
    return record.deadline


async def _stored(bus: Bus, stream: str, filt: str) -> Counter[str]:
    """How many messages each sandbox has on ``filt`` (by subject)."""
    info = await bus.js.stream_info(stream, subjects_filter=filt)
    return Counter({subjects.sandbox_id_of(s): n for s, n in (info.state.subjects or {}).items()})


async def _commands(bus: Bus, *, within: float) -> Counter[str]:
    """Commands per sandbox, pulled in batches from both command durables for ``within`` s."""
    got: Counter[str] = Counter()
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while loop.time() < end:
        for sub in bus._subs:
            try:
                msgs = await sub.fetch(200, timeout=0.1)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            for m in msgs:
                await m.ack()
                got[subjects.sandbox_id_of(m.subject)] += 1
    return got


async def _expired(bus: Bus) -> Counter[str]:
    return await _stored(bus, STREAM_EVT, "sandbox.evt.expired.>")


async def test_the_schedule_fires_a_lead_early_but_nothing_expires_before_the_deadline(
    bus: Bus, replicas: Any
) -> None:
    (replica,) = await replicas()
    consumer = BatchConsumer(
        bus.js, SCHEDULER_FIRED, replica.on_fired_batch, batch=50, wait=0.2, inflight=4
    )
    timers = NatsTimers(bus.js, lead=LEAD)
    sids = [f"sbx-l{i:02d}" for i in range(20)]
    records = {
        sid: await bus.put(sid, timeout=2 + i % 3, announce=False) for i, sid in enumerate(sids)
    }
    await asyncio.gather(*(timers.arm(effects.timeout_timer(r)) for r in records.values()))
    holder = await bus.js.get_last_msg(STREAM_TIMERS, holder_subject("timeout", sids[0]))
    fires_at = datetime.fromisoformat((holder.headers or {})["Nats-Schedule"].removeprefix("@at "))
    deadline = records[sids[0]].deadline
    assert deadline is not None and fires_at == deadline - LEAD
    assert json.loads(holder.data)["due"] == records[sids[0]].model_dump(mode="json")["deadline"]
    await consumer.start()
    try:
        got = [await bus.next_command(timeout=15) for _ in sids]
    finally:
        await consumer.stop()
    assert all(c is not None for c in got)
    for c in got:
        assert c is not None
        expected = records[c.sandbox_id].deadline
        assert expected is not None and c.stored_at >= expected, (c.sandbox_id, c.stored_at)
    assert sorted(c.sandbox_id for c in got if c is not None) == sorted(sids)
    assert set((await _expired(bus)).values()) == {1}


async def test_a_batch_holding_the_same_fire_twice_publishes_each_expiry_once(
    bus: Bus, replicas: Any
) -> None:
    (replica,) = await replicas()
    sids = [f"sbx-u{i:02d}" for i in range(30)]
    records = [await bus.put(sid, timeout=1, announce=False) for sid in sids]
    # Each fire twice in one batch (a redelivery next to the original), held until due.
    batch = [_fire(r.sandbox_id, _deadline(r)) for r in records] * 2
    outcomes = await replica.handlers.on_fired_batch(batch)
    assert outcomes == [None] * len(batch)
    # ...and the whole batch once more (redelivered after a crash before its acks).
    assert await replica.handlers.on_fired_batch(batch) == [None] * len(batch)
    assert await _commands(bus, within=1.5) == Counter(sids)
    assert await _expired(bus) == Counter(sids)


async def test_a_record_changed_while_its_fire_is_held_is_decided_as_it_is_then(
    bus: Bus, replicas: Any
) -> None:
    (replica,) = await replicas()
    kept, paused, extended = "sbx-kept", "sbx-paused", "sbx-extended"
    for sid in (kept, paused, extended):
        await bus.put(sid, timeout=1, announce=False)
    due = now() + timedelta(seconds=2.5)  # within lead + slack: every fire of the batch is held
    handling = asyncio.create_task(
        replica.handlers.on_fired_batch([_fire(sid, due) for sid in (kept, paused, extended)])
    )
    later = now() + timedelta(seconds=8)
    await bus.store.update(
        paused,
        lambda r: r.model_copy(
            update={"state": SandboxState.PAUSED, "generation": 2, "deadline": None}
        ),
    )
    await bus.store.update(extended, lambda r: r.model_copy(update={"deadline": later}))
    assert not handling.done()  # the change landed while the fires were held
    assert await handling == [None, None, None]
    # The extended one was re-armed at its new deadline (a lead early), not expired.
    holder = await bus.js.get_last_msg(STREAM_TIMERS, holder_subject("timeout", extended))
    assert Timer.model_validate_json(holder.data).due == later
    assert [c.sandbox_id for c in await bus.commands(within=1.0)] == [kept]
    assert await _expired(bus) == Counter({kept: 1})


async def test_a_publish_failing_mid_batch_fails_only_its_message_and_nothing_doubles(
    bus: Bus, replicas: Any
) -> None:
    sids = [f"sbx-f{i:02d}" for i in range(40)]
    broken = {subjects.of(subjects.CMD_PAUSE, sid) for sid in sids[15:18]}
    broken |= {subjects.of(subjects.CMD_KILL, sid) for sid in sids[25:27]}
    (replica,) = await replicas(failing=broken)
    records = [
        await bus.put(sid, timeout=1, auto_pause=i < 20, announce=False)
        for i, sid in enumerate(sids)
    ]
    batch = [_fire(r.sandbox_id, _deadline(r)) for r in records]
    outcomes = await replica.handlers.on_fired_batch(batch)
    failed = [d.subject for d, o in zip(batch, outcomes, strict=True) if o is not None]
    assert sorted(subjects.sandbox_id_of(s) for s in failed) == sorted(
        subjects.sandbox_id_of(s) for s in broken
    )
    # Their events went out before the command failed; the redelivery publishes the commands.
    assert await _expired(bus) == Counter(sids)
    redelivered = [d for d, o in zip(batch, outcomes, strict=True) if o is not None]
    assert await replica.handlers.on_fired_batch(redelivered) == [None] * len(redelivered)
    assert await _commands(bus, within=1.5) == Counter(sids)
    assert await _expired(bus) == Counter(sids)


async def test_two_replicas_over_one_set_of_fired_timers_expire_each_once(
    bus: Bus, replicas: Any
) -> None:
    pair = await replicas(2)
    consumers = [
        BatchConsumer(bus.js, SCHEDULER_FIRED, r.on_fired_batch, batch=10, wait=0.1, inflight=4)
        for r in pair
    ]
    sids = [f"sbx-p{i:03d}" for i in range(120)]
    records = [
        await bus.put(sid, timeout=1, auto_pause=i % 2 == 0, announce=False)
        for i, sid in enumerate(sids)
    ]
    # Held until the last deadline: a batch takes a while, the other replica pulls meanwhile.
    due = max(_deadline(r) for r in records)
    for sid in sids:
        await bus.js.publish(
            fired_subject(sid),
            Timer(kind="timeout", sandbox_id=sid, generation=1, due=due).model_dump_json().encode(),
        )
    for c in consumers:
        await c.start()
    try:
        commands = await _commands(bus, within=6.0)
    finally:
        for c in consumers:
            await c.stop()
    assert commands == Counter(sids)
    assert await _expired(bus) == Counter(sids)
    assert all(r.handled > 0 for r in pair), [r.handled for r in pair]
    assert sum(r.handled for r in pair) == len(sids)  # no fire was handled twice either
