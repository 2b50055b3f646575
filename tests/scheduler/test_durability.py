"""Deadlines survive a scheduler killed with SIGKILL, and two replicas never double-fire."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from shared.bus.topology import STREAM_EVT
from tests.scheduler.conftest import Bus


async def _expired_count(bus: Bus) -> int:
    info = await bus.js.stream_info(STREAM_EVT, subjects_filter="sandbox.evt.expired.>")
    return sum((info.state.subjects or {}).values())


@pytest.mark.slow
async def test_kill9_and_restart_in_the_middle_still_fires_every_deadline_once(
    bus: Bus, scheduler_process: Any
) -> None:
    first = scheduler_process(PAUSE_RESUME="true")
    await first.wait_ready()
    sids = [f"sbx-k{i:02d}" for i in range(30)]
    for i, sid in enumerate(sids):
        await bus.put(sid, timeout=1 + i % 6, auto_pause=i % 2 == 0)
    await asyncio.sleep(2.5)  # some deadlines have fired, some holders are still pending
    first.kill9()
    await asyncio.sleep(2.0)  # deadlines pass while no scheduler runs
    second = scheduler_process(PAUSE_RESUME="true")
    await second.wait_ready()
    # Past the consumers' 10 s ack wait: what the killed replica held in a batch unacked comes
    # back only then (9 s failed once at load 14).
    got = await bus.commands(within=14)
    per_sandbox = Counter(c.sandbox_id for c in got)
    assert sorted(per_sandbox) == sids
    assert set(per_sandbox.values()) == {1}, per_sandbox
    verbs = {c.sandbox_id: c.verb for c in got}
    assert all(verbs[sid] == ("pause" if i % 2 == 0 else "kill") for i, sid in enumerate(sids))
    assert await _expired_count(bus) == len(sids)


@pytest.mark.slow
async def test_two_replicas_do_not_double_fire(bus: Bus, scheduler_process: Any) -> None:
    replicas = [scheduler_process(PAUSE_RESUME="true"), scheduler_process(PAUSE_RESUME="true")]
    for r in replicas:
        await r.wait_ready()
    sids = [f"sbx-r{i:02d}" for i in range(40)]
    for i, sid in enumerate(sids):
        await bus.put(sid, timeout=1 + i % 4)
    got = await bus.commands(within=8)
    per_sandbox = Counter(c.sandbox_id for c in got)
    assert sorted(per_sandbox) == sids
    assert set(per_sandbox.values()) == {1}
    # Each fired timer was decided by exactly one replica (not merely deduplicated on publish).
    decided = [await r.metric("torpor_scheduler_expiries_total") for r in replicas]
    assert sum(decided) == len(sids), decided
    assert await _expired_count(bus) == len(sids)
