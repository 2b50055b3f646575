"""Two processes of one instance (e.g. two services' runtimes, or a runtime starting beside one
filling its pool): a sweep for leftovers waits for every pod start under way, and a pod start
waits for a sweep under way, so a fresh pod's namespace is never taken for a leftover (CI once
saw a starting runtime's sweep remove another's just-created pool pod namespace). The locks are
flocks in the data dir, taken here from separate PodNetwork objects as two processes would."""

from __future__ import annotations

import asyncio
from pathlib import Path

from shared.runtime.local.network import PodNetwork


async def _blocked(task: asyncio.Task[None], seconds: float = 0.5) -> bool:
    await asyncio.sleep(seconds)
    return not task.done()


async def test_a_sweep_waits_for_a_pod_start_and_a_start_for_a_sweep(tmp_path: Path) -> None:
    starter, sweeper = PodNetwork(tmp_path), PodNetwork(tmp_path)
    order: list[str] = []

    async def sweep() -> None:
        async with sweeper.sweep_lock():
            order.append("swept")

    async with starter.address_lock("10.0.0.2"):
        swept = asyncio.create_task(sweep())
        assert await _blocked(swept)  # the start is under way: the sweep waits
        order.append("recorded")
    await asyncio.wait_for(swept, 10)
    assert order == ["recorded", "swept"]

    async def start(address: str) -> None:
        async with starter.address_lock(address):
            order.append(f"started {address}")

    async with sweeper.sweep_lock():
        started = asyncio.create_task(start("10.0.0.3"))  # a new address: no lock file yet
        assert await _blocked(started)
        order.append("swept again")
    await asyncio.wait_for(started, 10)
    assert order[-2:] == ["swept again", "started 10.0.0.3"]


async def test_starts_at_two_addresses_do_not_wait_for_each_other(tmp_path: Path) -> None:
    one, two = PodNetwork(tmp_path), PodNetwork(tmp_path)
    async with one.address_lock("10.0.0.2"):
        async with asyncio.timeout(5):
            async with two.address_lock("10.0.0.4"):
                pass
