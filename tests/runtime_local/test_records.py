"""The workload store's wake-up (shared/runtime/local/records.py ``WorkloadStore.changed``): a
write of a record through the store wakes that record's waiters at once (wait_ready of a warm
pod no longer sleeps out a poll), only that record's, and a failed write wakes nobody. Real
nats-server, real JetStream KV."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from shared.errors import Conflict
from shared.runtime.local.records import WorkloadRecord, WorkloadStore

pytestmark = pytest.mark.timeout(60)


def record(name: str) -> WorkloadRecord:
    return WorkloadRecord(
        name=name, template="sandbox-base", owner="", labels={}, annotations={}, replicas=0,
        address="10.224.0.2",
    )  # fmt: skip


@pytest.fixture
async def store(nc: Any) -> Any:
    bucket = f"test_records_{uuid.uuid4().hex[:8]}"
    js = nc.jetstream()
    kv = await js.create_key_value(bucket=bucket)
    yield WorkloadStore(kv)
    await js.delete_key_value(bucket)


async def test_a_write_wakes_only_that_records_waiters(store: WorkloadStore) -> None:
    a, b = f"sbx-{uuid.uuid4().hex[:8]}", f"sbx-{uuid.uuid4().hex[:8]}"
    assert await store.create(record(a)) is not None
    woken_a, woken_b = store.changed(a), store.changed(b)
    assert woken_a is store.changed(a)  # one event per record while someone waits
    assert not woken_a.is_set()
    await store.mutate(a, lambda r: r.model_copy(update={"replicas": 1}))
    assert woken_a.is_set()
    assert not woken_b.is_set()  # another record's write wakes nobody here
    # The next waiter of ``a`` waits for the next write, not the one before.
    again = store.changed(a)
    assert again is not woken_a and not again.is_set()
    assert await store.create(record(b)) is not None
    assert woken_b.is_set() and not again.is_set()


async def test_a_failed_write_wakes_nobody(store: WorkloadStore) -> None:
    name = f"sbx-{uuid.uuid4().hex[:8]}"
    revision = await store.create(record(name))
    assert revision is not None
    waiting = store.changed(name)
    assert await store.create(record(name)) is None  # the key exists: nothing written
    with pytest.raises(Conflict):
        await store.put(record(name).model_copy(update={"replicas": 1}), last=revision + 99)
    with pytest.raises(Conflict):
        await store.remove(name, last=revision + 99)
    assert not waiting.is_set()
    await store.remove(name, last=revision)
    assert waiting.is_set()


async def test_a_waiter_wakes_before_its_timeout(store: WorkloadStore) -> None:
    """The wait returns on the write, not at the end of its (here: long) timeout."""
    name = f"sbx-{uuid.uuid4().hex[:8]}"
    assert await store.create(record(name)) is not None
    waiting = store.changed(name)
    waiter = asyncio.ensure_future(asyncio.wait_for(waiting.wait(), 30))
    await store.mutate(name, lambda r: r.model_copy(update={"replicas": 1}))
    assert await waiter is True
