"""Many sandboxes, three replicas of each worker, duplicate and racing commands: every sandbox
ends consistent, each resume replays each process exactly once in its new pod."""

from __future__ import annotations

import asyncio

import pytest

from shared.bus import subjects
from shared.domain.states import SandboxState
from shared.lifecycle.replay import duplicates
from shared.models.messages import KillSandbox, PauseSandbox, ResumeSandbox, msg_id
from shared.models.snapshots import ProcessConfig, SnapshotProcess
from shared.ports.lifecycle import CreateRequest
from shared.ports.workloads import Endpoint
from tests.fakes.runtime import FakeEnvd, FakeRuntime
from tests.lifecycle.harness import System, running_system

N_SANDBOXES = 8
PROCS = [
    SnapshotProcess(
        config=ProcessConfig(cmd="/bin/bash", args=["-l", "-c", f"sleep 100{i}"], cwd="/workspace"),
        pid=i,
    )
    for i in range(3)
]


async def _pause_with_duplicates(system: System, sid: str) -> None:
    rec = await system.store.get(sid)
    assert rec is not None
    cmd = PauseSandbox(sandbox_id=sid, generation=rec.generation, reason="timeout")
    subject = subjects.of(subjects.CMD_PAUSE, sid)
    # The scheduler's timeout pause (same id as the user's), and a foreign platform duplicate.
    await system.publisher.publish(cmd, subject, msg_id=msg_id("pause", sid, rec.generation))
    await system.publisher.publish(cmd, subject, msg_id=f"platform-{sid}-{rec.generation}")
    paused = (
        await system.lifecycle.pause(sid, owner="alice", wait=20)
        if rec.state == SandboxState.RUNNING
        else rec
    )
    assert paused.state == SandboxState.PAUSED


async def _resume_with_duplicates(system: System, sid: str) -> None:
    rec = await system.store.get(sid)
    assert rec is not None
    cmd = ResumeSandbox(sandbox_id=sid, generation=rec.generation)
    subject = subjects.of(subjects.CMD_RESUME, sid)
    await system.publisher.publish(cmd, subject, msg_id=f"platform-{sid}-{rec.generation}")
    results = await asyncio.gather(
        *(system.lifecycle.resume(sid, owner="alice", wait=20) for _ in range(3))
    )
    assert all(r.record.state == SandboxState.RUNNING for r in results)


@pytest.mark.slow
async def test_three_replicas_duplicates_and_races(fresh_nats) -> None:  # type: ignore[no-untyped-def]
    runtime, envd = FakeRuntime(), FakeEnvd()
    async with running_system(fresh_nats.url, runtime, envd, replicas=3) as system:
        sids = [f"sbx-c{i}" for i in range(N_SANDBOXES)]
        await asyncio.gather(
            *(system.lifecycle.create(CreateRequest(owner="alice", sandbox_id=s)) for s in sids)
        )
        for sid in sids:
            rec = await system.store.get(sid)
            assert rec is not None and rec.host and rec.pod_uid
            for p in PROCS:
                await envd.start_process(
                    Endpoint(host=rec.host, pod_uid=rec.pod_uid),
                    p.config,
                    tag=None,
                    access_token=None,
                )

        for _cycle in range(3):
            await asyncio.gather(*(_pause_with_duplicates(system, s) for s in sids))
            await asyncio.gather(*(_resume_with_duplicates(system, s) for s in sids))

        # A kill racing a pause on one sandbox ends killed, with no workload left behind.
        victim = sids[0]
        rec = await system.store.get(victim)
        assert rec is not None
        await asyncio.gather(
            system.publisher.publish(
                PauseSandbox(sandbox_id=victim, generation=rec.generation),
                subjects.of(subjects.CMD_PAUSE, victim),
                msg_id=msg_id("pause", victim, rec.generation),
            ),
            system.publisher.publish(
                KillSandbox(sandbox_id=victim, generation=rec.generation),
                subjects.of(subjects.CMD_KILL, victim),
                msg_id=msg_id("kill", victim, rec.generation),
            ),
        )
        killed = await system.store.wait_for(
            victim, lambda r: r.state == SandboxState.KILLED, timeout=20
        )
        assert killed.state == SandboxState.KILLED
        await asyncio.sleep(1.0)  # let a late snapshotted/scale finish, if any
        assert victim not in runtime.workloads

        for sid in sids[1:]:
            rec = await system.store.get(sid)
            assert rec is not None and rec.state == SandboxState.RUNNING, (sid, rec)
            assert rec.generation == 1 + 3 * 2
            pod = rec.pod_uid or ""
            live = envd.pods[pod]
            assert len(live) == len(PROCS) and not duplicates(live), (sid, live)
            assert envd.started[pod] == len(PROCS)  # exactly one replay per resume
            assert [p.config.args for p in live] == [p.config.args for p in PROCS]  # in order
