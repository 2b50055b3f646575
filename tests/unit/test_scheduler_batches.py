"""The scheduler's batch handlers in memory: one outcome per message, a bad message fails alone,
and a batch whose records did not move is settled without a re-read per sandbox (the real-bus
side: tests/scheduler/test_batches.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from services.scheduler import plans
from services.scheduler.handlers import SchedulerHandlers
from shared.bus import subjects
from shared.bus.batches import Delivery
from shared.bus.schedules import Timer
from shared.domain.record import SandboxRecord
from shared.models.messages import SandboxCreated
from shared.settings import FeatureFlags
from tests.fakes.clock import FakeClock
from tests.fakes.publisher import RecordingPublisher
from tests.fakes.records import running_record
from tests.fakes.store import InMemorySandboxStore
from tests.fakes.timers import FakeTimers

pytestmark = pytest.mark.unit


class CountingStore(InMemorySandboxStore):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.reads = 0

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        self.reads += 1
        return await super().get(sandbox_id)


class Version:
    """The records bucket's last sequence, as the handler sees it."""

    def __init__(self) -> None:
        self.value = 7
        self.calls = 0

    async def __call__(self) -> int:
        self.calls += 1
        return self.value


def make(
    clock: FakeClock, store: InMemorySandboxStore, timers: FakeTimers, version: Version | None
) -> SchedulerHandlers:
    return SchedulerHandlers(
        store=store,
        publisher=RecordingPublisher(),
        timers=timers,
        flags=FeatureFlags(PAUSE_RESUME="true"),
        policy=plans.Policy(
            retention=timedelta(days=1), pause_check=timedelta(seconds=30), pause_attempts=3
        ),
        clock=clock,
        records_version=version,
    )


def created(sid: str, clock: FakeClock) -> Delivery:
    body = SandboxCreated(sandbox_id=sid, generation=1, at=clock()).model_dump_json().encode()
    return Delivery(subjects.of(subjects.EVT_CREATED, sid), body, {}, 1)


async def test_each_message_of_a_batch_has_its_own_outcome_and_a_bad_one_fails_alone() -> None:
    clock = FakeClock()
    store, timers = CountingStore(clock), FakeTimers()
    handlers = make(clock, store, timers, Version())
    records = [running_record(f"sbx-{i}", at=clock(), timeout=60 + i) for i in range(3)]
    for r in records:
        await store.create(r)
    batch = [created(r.sandbox_id, clock) for r in records]
    # An activity event's body is read: a hostile one cannot be handled, ever.
    bad = b'{"sandbox_id": "\x00--ro-bind", "at": "NaN"}'
    batch.insert(1, Delivery(subjects.of(subjects.EVT_ACTIVITY, "sbx-0"), bad, {}, 1))
    batch.append(created("sbx-gone", clock))  # an event for a sandbox with no record

    outcomes = await handlers.on_event_batch(batch)

    assert outcomes[0] is None and outcomes[2] is None and outcomes[3] is None
    assert isinstance(outcomes[1], ValidationError)  # dead-lettered by the consumer
    assert outcomes[4] is None  # nothing to arm for a record that is gone: acked
    for r in records:
        pending = await timers.pending(r.sandbox_id, "timeout")
        assert pending is not None and pending.due == r.deadline


async def test_a_batch_whose_records_did_not_move_is_settled_without_a_reread() -> None:
    clock = FakeClock()
    store, timers, version = CountingStore(clock), FakeTimers(), Version()
    handlers = make(clock, store, timers, version)
    for i in range(20):
        await store.create(running_record(f"sbx-{i}", at=clock(), timeout=60))
    store.reads = 0

    outcomes = await handlers.on_event_batch([created(f"sbx-{i}", clock) for i in range(20)])

    assert outcomes == [None] * 20
    assert store.reads == 20  # one read per sandbox, none to settle
    assert version.calls == 2  # before the first read, after the last arm


_EARLIER = timedelta(seconds=30)


class RacingTimers(FakeTimers):
    """Arming races with a ``set_timeout`` on the same sandbox: the record moves right after the
    handler read it (another replica armed the new deadline, and this arm overwrites it)."""

    def __init__(self, store: InMemorySandboxStore, version: Version, sid: str) -> None:
        super().__init__()
        self._store, self._version, self._sid = store, version, sid
        self.moved_to: SandboxRecord | None = None

    async def arm(self, timer: Timer) -> None:
        await super().arm(timer)
        if timer.sandbox_id == self._sid and self.moved_to is None:
            self.moved_to = await self._store.update(
                self._sid,
                lambda r: r.model_copy(
                    update={"deadline": (r.deadline or r.started_at) - _EARLIER}
                ),
            )
            self._version.value += 1


@pytest.mark.parametrize("with_version", [True, False])
async def test_a_record_that_moved_during_the_batch_is_armed_at_its_latest_deadline(
    with_version: bool,
) -> None:
    clock = FakeClock()
    store, version = CountingStore(clock), Version()
    timers = RacingTimers(store, version, "sbx-3")
    handlers = make(clock, store, timers, version if with_version else None)
    for i in range(6):
        await store.create(running_record(f"sbx-{i}", at=clock(), timeout=60))

    outcomes = await handlers.on_event_batch([created(f"sbx-{i}", clock) for i in range(6)])

    assert outcomes == [None] * 6
    assert timers.moved_to is not None and timers.moved_to.deadline is not None
    pending = await timers.pending("sbx-3", "timeout")
    assert pending is not None and pending.due == timers.moved_to.deadline


async def test_the_version_failing_fails_the_batch_for_a_retry_not_silently() -> None:
    clock = FakeClock()
    store, timers = CountingStore(clock), FakeTimers()

    class Broken(Version):
        async def __call__(self) -> int:
            self.calls += 1
            if self.calls > 1:
                raise TimeoutError("bus down")
            return 1

    handlers = make(clock, store, timers, Broken())
    await store.create(running_record("sbx-1", at=clock(), timeout=60))
    outcomes = await handlers.on_event_batch([created("sbx-1", clock)])
    assert len(outcomes) == 1 and isinstance(outcomes[0], TimeoutError)


async def test_fired_batches_have_one_outcome_per_timer() -> None:
    clock = FakeClock()
    store, timers = CountingStore(clock), FakeTimers()
    handlers = make(clock, store, timers, Version())
    record = running_record("sbx-f", at=clock(), timeout=1)
    await store.create(record)
    assert record.deadline is not None
    timer = Timer(kind="timeout", sandbox_id="sbx-f", generation=1, due=record.deadline)
    clock.advance(2)
    fired = Delivery(
        subjects.of(subjects.TIMER_FIRED, "sbx-f"), timer.model_dump_json().encode(), {}, 1
    )
    junk = Delivery(subjects.of(subjects.TIMER_FIRED, "sbx-x"), b"\xff\xfe not json", {}, 3)
    outcomes = await handlers.on_fired_batch([junk, fired])
    assert outcomes[1] is None
    assert isinstance(outcomes[0], ValueError)  # a ValidationError: dead-lettered
