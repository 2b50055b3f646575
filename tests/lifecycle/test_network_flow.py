"""Network policy through the real bus and the real scaler handler (fake pods): the create
carries the record's policy to the workload, ``set_network`` becomes ``sandbox.cmd.network``
and reaches ``Runtime.set_network``, the last write wins, a paused workload keeps it, and a
killed sandbox cannot be changed. Also: a killed tombstone is never reused by another owner."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from shared.errors import Conflict, NotFound
from shared.models.network import NetworkPolicy
from shared.ports.lifecycle import CreateRequest
from tests.fakes.runtime import FakeEnvd, FakeRuntime
from tests.lifecycle.harness import System, running_system


@pytest.fixture
async def system(fresh_nats) -> AsyncIterator[System]:  # type: ignore[no-untyped-def]
    async with running_system(fresh_nats.url, FakeRuntime(), FakeEnvd()) as s:
        yield s


async def _applied(runtime: FakeRuntime, sid: str, want: NetworkPolicy) -> None:
    deadline = time.monotonic() + 20
    while runtime.networks.get(sid) != want:
        assert time.monotonic() < deadline, f"{runtime.networks.get(sid)} never became {want}"
        await asyncio.sleep(0.05)


async def test_policy_reaches_the_runtime_and_the_last_write_wins(system: System) -> None:
    runtime: FakeRuntime = system.runtime  # type: ignore[assignment]
    closed = NetworkPolicy(allow_internet=False, allow_public_traffic=False)
    await system.lifecycle.create(
        CreateRequest(owner="alice", sandbox_id="sbx-net", network=closed)
    )
    assert runtime.networks["sbx-net"] == closed  # from the record, at create

    a = NetworkPolicy(deny_out=("10.0.0.0/8",))
    b = NetworkPolicy(allow_out=("10.1.0.0/16",), deny_out=("0.0.0.0/0",))
    for policy in (a, b, a):  # A again must apply again (message ids are per write)
        record = await system.lifecycle.set_network("sbx-net", owner="alice", policy=policy)
        assert record.network == policy
    await _applied(runtime, "sbx-net", a)

    with pytest.raises(NotFound):  # another user's sandbox does not exist for them
        await system.lifecycle.set_network("sbx-net", owner="bob", policy=b)

    await system.lifecycle.pause("sbx-net", owner="alice", wait=10)
    await system.lifecycle.set_network("sbx-net", owner="alice", policy=b)
    await _applied(runtime, "sbx-net", b)  # the workload at 0 replicas keeps it
    resumed = await system.lifecycle.resume("sbx-net", owner="alice", wait=10)
    assert resumed.record.network == b
    assert runtime.networks["sbx-net"] == b

    await system.lifecycle.kill("sbx-net", owner="alice", wait=10)
    with pytest.raises(NotFound):
        await system.lifecycle.set_network("sbx-net", owner="alice", policy=a)


async def test_another_owners_tombstone_is_not_reused(system: System) -> None:
    await system.lifecycle.create(CreateRequest(owner="bob", sandbox_id="sbx-tomb"))
    await system.lifecycle.kill("sbx-tomb", owner="bob", wait=10)
    with pytest.raises(Conflict):
        await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-tomb"))
    tomb = await system.store.get("sbx-tomb")
    assert tomb is not None and tomb.owner == "bob"
