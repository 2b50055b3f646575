"""A runtime starting beside another of the same instance (two services' runtimes, a second
scaler replica): its start-up sweep releases what is left over and stops stray pods, but never
takes the address, host id range or pod of a create, a start or a claim under way in the other.

CI once saw it happen (tests/runtime_local/test_pools.py): the second runtime's sweep released
the address the first had just reserved for a pool pod (its record not written yet); the
address was then reserved again for a sandbox while the pool pod ran there, so two pods shared
it and the claim's ``/init`` met the wrong daemon (401) or none. Two workloads on one host id
range could also signal each other. Real nats-server, real runtimes on one data dir and bucket.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from shared.ports.workloads import WorkloadSpec
from shared.runtime.local import procfs, reconciler
from shared.runtime.local.addresses import address_key
from shared.runtime.local.network import PodNetwork
from shared.runtime.local.records import LEFT_OVER_AFTER, Reservation, workload_key
from shared.runtime.local.userns import range_key
from tests.runtime_local.support import LocalRuntimeFactory


async def test_a_starting_runtime_keeps_what_a_create_beside_it_just_reserved(
    local_runtime: LocalRuntimeFactory,
) -> None:
    first = await local_runtime()
    addresses, ids = first._addresses, first._id_ranges_
    assert ids is not None
    # A create under way in the first runtime: reserved, its record not written yet.
    address = await addresses.reserve("sbx-being-created")
    base = await ids.reserve("sbx-being-created")
    # A create that died between the two steps long ago: left over.
    gone_address = await addresses.reserve("sbx-gone")
    gone_base = await ids.reserve("sbx-gone")
    stale = Reservation(workload="sbx-gone", at=time.time() - LEFT_OVER_AFTER - 1)
    kv = addresses._kv
    await kv.put(address_key(gone_address), stale.model_dump_json().encode())
    await kv.put(range_key(gone_base), stale.model_dump_json().encode())
    # A value that is no reservation (hostile or corrupt) is never released nor reused.
    await kv.put(address_key("10.0.0.77"), b'{"workload": "x", "at": 1, "admin": true}')

    await local_runtime()  # its start-up sweep runs now

    assert await addresses.holder(address) == "sbx-being-created"
    assert await ids.holder(base) == "sbx-being-created"
    assert await addresses.holder(gone_address) is None
    assert await ids.holder(gone_base) is None
    assert (await kv.get(address_key("10.0.0.77"))).value is not None
    # And the next reservation does not get the address still held.
    assert await addresses.reserve("sbx-next") not in {address}


async def test_the_leftover_sweep_waits_for_a_pod_start_under_way(
    local_runtime: LocalRuntimeFactory, data_dir: Path
) -> None:
    """A pod being started is recorded before its start lets go of the sweep lock; the sweep
    lists the pods only once it holds that lock, so it never sees an unrecorded fresh pod."""
    runtime = await local_runtime()
    other_process = PodNetwork(data_dir)
    async with other_process.address_lock("10.0.0.9"):
        sweep = asyncio.create_task(runtime._reconciler.sweep_leftovers())
        await asyncio.sleep(0.5)
        assert not sweep.done()
    await asyncio.wait_for(sweep, 10)


async def test_a_pod_whose_record_is_gone_is_stopped_while_the_runtime_runs(
    local_runtime: LocalRuntimeFactory, data_dir: Path
) -> None:
    """A pod can lose its record while the runtime runs (a start whose record write met a NATS
    restart, a process killed between the two): the periodic sweep stops it, on its second
    sighting, without a restart; the pod beside it that has its record runs on."""
    runtime = await local_runtime()
    await runtime.create(WorkloadSpec(name="sbx-kept", owner="alice"))
    await runtime.create(WorkloadSpec(name="sbx-lost", owner="alice"))
    kept = await runtime.wait_ready("sbx-kept", timeout=60)
    lost = await runtime.wait_ready("sbx-lost", timeout=60)
    await runtime._store._kv.delete(workload_key("sbx-lost"))
    for _ in range(300):  # two sweeps 10 s apart
        if lost.pod_uid not in {p.uid for p in procfs.scan_pods(data_dir)}:
            break
        await asyncio.sleep(0.2)
    running = {p.uid for p in procfs.scan_pods(data_dir)}
    assert lost.pod_uid not in running
    assert kept.pod_uid in running
    assert (await runtime.get("sbx-kept")).pod_uid == kept.pod_uid


async def test_a_pod_whose_record_write_fails_is_stopped_at_once(
    local_runtime: LocalRuntimeFactory, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write that records a started pod fails (NATS restarting): the start stops its pod
    itself, not the periodic sweep (turned off here), and the next pass starts one that is
    recorded."""
    monkeypatch.setattr(reconciler, "_SWEEP_EVERY", 1e9)
    runtime = await local_runtime()
    store = runtime._store
    real_mutate = store.mutate
    failed: list[str] = []

    async def mutate(name: str, change: Any) -> Any:
        current = await store.get(name)
        if not failed and current is not None and current[0].pod is None:
            after = change(current[0])
            if after is not None and after.pod is not None:
                failed.append(after.pod.uid)
                raise ConnectionError("nats: connection closed")
        return await real_mutate(name, change)

    monkeypatch.setattr(store, "mutate", mutate)
    await runtime.create(WorkloadSpec(name="sbx-unlucky", owner="alice"))
    ready = await runtime.wait_ready("sbx-unlucky", timeout=60)
    assert len(failed) == 1 and ready.pod_uid != failed[0]
    assert {p.uid for p in procfs.scan_pods(data_dir)} == {ready.pod_uid}
