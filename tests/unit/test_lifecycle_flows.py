"""Pause/resume/kill flows in memory: the real ``SandboxLifecycle``, the snapshotter's and the
scaler's real routers on FastStream's test broker, the in-memory record store and publisher.

The same flows run on a real nats-server in tests/lifecycle/test_flows_fake_runtime.py.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from shared.domain.states import SandboxState
from shared.errors import IllegalTransition, NotFound, RuntimeFailure
from shared.models.messages import (
    SandboxActivity,
    SandboxCreated,
    SandboxResumed,
    SandboxTimeoutSet,
)
from shared.models.snapshots import ProcessConfig, SnapshotProcess
from shared.ports.lifecycle import CreateRequest
from shared.ports.workloads import ANNOTATION_SNAPSHOT, Endpoint
from tests.fakes.system import InMemorySystem, in_memory_system

pytestmark = pytest.mark.unit

SERVER = SnapshotProcess(
    config=ProcessConfig(
        cmd="/bin/bash", args=["-l", "-c", "python3 server.py > service.log 2>&1"], cwd="/workspace"
    ),
    pid=20,
)


@pytest.fixture
async def system() -> AsyncIterator[InMemorySystem]:
    async with in_memory_system() as s:
        yield s


async def _start_process(system: InMemorySystem, sid: str, proc: SnapshotProcess) -> None:
    record = await system.store.get(sid)
    assert record is not None and record.host and record.pod_uid
    await system.envd.start_process(
        Endpoint(host=record.host, pod_uid=record.pod_uid),
        proc.config,
        tag=proc.tag,
        access_token=None,
    )


async def test_create_pause_resume_cycle(system: InMemorySystem) -> None:
    rec = await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-cycle"))
    assert rec.state == SandboxState.RUNNING and rec.generation == 1 and rec.deadline is not None
    await _start_process(system, "sbx-cycle", SERVER)

    paused = await system.lifecycle.pause("sbx-cycle", owner="alice", wait=5)
    assert paused.state == SandboxState.PAUSED and paused.generation == 2
    assert paused.host is None and paused.deadline is None and paused.retain_until is not None
    wl = system.runtime.workloads["sbx-cycle"]
    assert wl.replicas == 0 and wl.pod_uid is None
    doc = json.loads(base64.b64decode(wl.annotations[ANNOTATION_SNAPSHOT]))
    assert [p["config"]["args"] for p in doc["processes"]] == [SERVER.config.args]
    assert paused.snapshot is not None
    assert paused.snapshot.annotation == wl.annotations[ANNOTATION_SNAPSHOT]

    with pytest.raises(IllegalTransition):
        await system.lifecycle.pause("sbx-cycle", owner="alice", wait=5)

    result = await system.lifecycle.resume("sbx-cycle", owner="alice", wait=5)
    assert result.resumed and result.record.state == SandboxState.RUNNING
    assert result.record.generation == 3 and result.record.pod_uid != rec.pod_uid
    new_pod = result.record.pod_uid or ""
    assert [p.config.args for p in system.envd.pods[new_pod]] == [SERVER.config.args]
    again = await system.lifecycle.resume("sbx-cycle", owner="alice", wait=5)
    assert not again.resumed and system.envd.started[new_pod] == 1

    # Every command and event went out once, with the id derived from sandbox and generation.
    ids = [p.msg_id for p in system.publisher.published]
    assert ids[:3] == ["create:sbx-cycle:g0", "created:sbx-cycle:g1", "pause:sbx-cycle:g1"]
    assert {"snapshotted:sbx-cycle:g1", "paused:sbx-cycle:g2", "resumed:sbx-cycle:g3"} <= set(ids)
    assert len(ids) == len(set(ids))


async def test_events_say_whether_the_pod_came_from_the_warm_pool(system: InMemorySystem) -> None:
    await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-cold"))
    system.runtime.warm_pods = 1
    await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-warm"))
    await system.lifecycle.pause("sbx-warm", owner="alice", wait=5)
    await system.lifecycle.resume("sbx-warm", owner="alice", wait=5)  # the pool is empty now
    system.runtime.warm_pods = 1
    await system.lifecycle.pause("sbx-warm", owner="alice", wait=5)
    await system.lifecycle.resume("sbx-warm", owner="alice", wait=5)

    created = {e.sandbox_id: e.path for e in system.publisher.of_type(SandboxCreated)}
    assert created == {"sbx-cold": "cold", "sbx-warm": "warm"}
    assert [e.path for e in system.publisher.of_type(SandboxResumed)] == ["cold", "warm"]


async def test_a_redelivered_command_republishes_the_path_the_pod_came_by(
    system: InMemorySystem,
) -> None:
    """A scaler that crashed after the record turned running but before the event went out: the
    redelivered command finds the work done and sends the event again, from the record."""
    from services.scaler.scaling import Scaler
    from shared.models.messages import CreateSandbox, ResumeSandbox, msg_id
    from tests.fakes.publisher import RecordingPublisher

    system.runtime.warm_pods = 1
    created = await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-w"))
    assert created.path == "warm"
    await system.lifecycle.pause("sbx-w", owner="alice", wait=5)
    system.runtime.warm_pods = 1
    resumed = await system.lifecycle.resume("sbx-w", owner="alice", wait=5)
    assert resumed.record.path == "warm"
    await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-c"))
    system.runtime.warm_pods = 1
    await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-cw"))

    publisher = RecordingPublisher()
    scaler = Scaler(
        store=system.store, runtime=system.runtime, envd=system.envd, publisher=publisher
    )
    paused_at = resumed.record.generation - 1
    again = ResumeSandbox(sandbox_id="sbx-w", generation=paused_at)
    assert await scaler.resume(again, msg_id("resume", "sbx-w", paused_at)) == "skipped"
    for sid in ("sbx-cw", "sbx-c"):
        create = CreateSandbox(sandbox_id=sid, owner="alice")
        assert await scaler.create(create, msg_id("create", sid, 0)) == "skipped"
    assert [e.path for e in publisher.of_type(SandboxResumed)] == ["warm"]
    assert {e.sandbox_id: e.path for e in publisher.of_type(SandboxCreated)} == {
        "sbx-cw": "warm",
        "sbx-c": "cold",
    }


async def test_unknown_and_foreign_sandboxes_are_not_found(system: InMemorySystem) -> None:
    with pytest.raises(NotFound):
        await system.lifecycle.pause("nope", owner="alice")
    await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-mine"))
    with pytest.raises(NotFound):
        await system.lifecycle.get("sbx-mine", owner="bob")
    with pytest.raises(NotFound):
        await system.lifecycle.resume("sbx-mine", owner="bob")
    with pytest.raises(NotFound):
        await system.lifecycle.set_timeout("sbx-mine", owner="bob", timeout=60)


async def test_kill_leaves_tombstone_and_id_can_be_reused(system: InMemorySystem) -> None:
    await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-kill"))
    await system.lifecycle.pause("sbx-kill", owner="alice", wait=5)
    await system.lifecycle.kill("sbx-kill", owner="alice", wait=5)
    assert "sbx-kill" not in system.runtime.workloads
    tomb = await system.store.get("sbx-kill")
    assert tomb is not None and tomb.state == SandboxState.KILLED
    with pytest.raises(NotFound):
        await system.lifecycle.get("sbx-kill", owner="alice")
    again = await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-kill"))
    assert again.state == SandboxState.RUNNING and again.generation > tomb.generation


async def test_daemon_down_fails_the_pause_and_keeps_the_pod() -> None:
    async with in_memory_system(give_up_after=1) as system:  # one delivery here: give up at once
        rec = await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-down"))
        system.envd.down = True
        with pytest.raises(RuntimeFailure, match="daemon down"):
            await system.lifecycle.pause("sbx-down", owner="alice", wait=5)
        failed = await system.store.get("sbx-down")
        assert failed is not None and failed.state == SandboxState.FAILED
        assert failed.failure is not None and failed.failure.startswith("pause")
        assert system.runtime.workloads["sbx-down"].pod_uid == rec.pod_uid  # never scaled down
        system.envd.down = False
        result = await system.lifecycle.resume("sbx-down", owner="alice", wait=5)
        assert result.record.state == SandboxState.RUNNING
        assert result.record.pod_uid == rec.pod_uid
        assert system.envd.started.get(rec.pod_uid or "", 0) == 0


async def test_a_pause_holds_the_processes_and_a_failed_one_continues_them() -> None:
    """The pause asks for its hold (the pod stops with its processes stopped after the copy);
    one that fails asks the runtime to continue them, and a thaw that fails too (the daemon
    gone) still leaves the pause failed on the record, not stuck."""
    async with in_memory_system(give_up_after=1, hold=90) as system:
        await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-held"))
        paused = await system.lifecycle.pause("sbx-held", owner="alice", wait=5)
        assert paused.state == SandboxState.PAUSED
        assert system.runtime.holds == [("sbx-held", 90)]
        assert system.runtime.thawed == []

        await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-thaw"))
        system.runtime.keep_failure = RuntimeFailure("the kept-files store is down")
        system.runtime.thaw_failure = RuntimeFailure("the daemon is gone")
        with pytest.raises(RuntimeFailure, match="store is down"):
            await system.lifecycle.pause("sbx-thaw", owner="alice", wait=5)
        failed = await system.store.get("sbx-thaw")
        assert failed is not None and failed.state == SandboxState.FAILED
        assert system.runtime.thawed == ["sbx-thaw"]
        assert ("sbx-thaw", 0) not in system.runtime.scale_calls


async def test_a_resume_onto_the_pod_a_pause_failed_on_continues_its_processes() -> None:
    """The scaler could not stop the pod after a held export (the sandbox ``failed``, its
    processes stopped until the hold ends): a resume onto that same pod continues them."""
    async with in_memory_system(give_up_after=1, hold=90) as system:
        rec = await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-stuck"))
        system.runtime.stop_failure = RuntimeFailure("the API server refused the scale")
        with pytest.raises(RuntimeFailure, match="refused the scale"):
            await system.lifecycle.pause("sbx-stuck", owner="alice", wait=5)
        assert system.runtime.holds == [("sbx-stuck", 90)]
        system.runtime.stop_failure = None
        system.runtime.thaw_failure = RuntimeFailure("the daemon is slow")  # best effort
        result = await system.lifecycle.resume("sbx-stuck", owner="alice", wait=5)
        assert result.record.state == SandboxState.RUNNING
        assert result.record.pod_uid == rec.pod_uid
        assert system.runtime.thawed == ["sbx-stuck"]

        # A resume into a new pod has nothing held to continue.
        await system.lifecycle.pause("sbx-stuck", owner="alice", wait=5)
        await system.lifecycle.resume("sbx-stuck", owner="alice", wait=5)
        assert system.runtime.thawed == ["sbx-stuck"]


async def test_snapshot_too_large_fails_the_pause_without_retrying(system: InMemorySystem) -> None:
    rec = await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-big"))
    big = SnapshotProcess(
        config=ProcessConfig(cmd="/bin/true", args=[], envs={"BLOB": "x" * 300_000}), pid=5
    )
    await _start_process(system, "sbx-big", big)
    with pytest.raises(RuntimeFailure, match="annotation budget"):
        await system.lifecycle.pause("sbx-big", owner="alice", wait=5)
    assert system.runtime.workloads["sbx-big"].pod_uid == rec.pod_uid
    assert ("sbx-big", 0) not in system.runtime.scale_calls
    # The failure event is public: it carries the reason, never the process's environment.
    failed = [p for p in system.publisher.published if p.verb == "failed"]
    assert len(failed) == 1 and "x" * 100 not in failed[0].message.model_dump_json()


async def test_failing_process_is_reported_and_sandbox_still_resumes(
    system: InMemorySystem,
) -> None:
    await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-partial"))
    broken = SnapshotProcess(config=ProcessConfig(cmd="/nonexistent", args=["x"]), pid=7, tag="t1")
    await _start_process(system, "sbx-partial", broken)
    await _start_process(system, "sbx-partial", SERVER)
    await system.lifecycle.pause("sbx-partial", owner="alice", wait=5)
    system.envd.fail_cmds.add("/nonexistent")
    result = await system.lifecycle.resume("sbx-partial", owner="alice", wait=5)
    assert result.record.state == SandboxState.RUNNING
    assert [p.config.cmd for p in system.envd.pods[result.record.pod_uid or ""]] == ["/bin/bash"]


async def test_timeouts_move_the_deadline_and_announce_it(system: InMemorySystem) -> None:
    rec = await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-time"))
    assert rec.deadline is not None
    shorter = await system.lifecycle.set_timeout("sbx-time", owner="alice", timeout=60)
    assert shorter.timeout == 60 and shorter.deadline is not None
    assert shorter.deadline < rec.deadline
    same = await system.lifecycle.extend_timeout("sbx-time", owner="alice", timeout=10)
    assert same.deadline == shorter.deadline  # connect never shortens
    await system.lifecycle.touch("sbx-time")
    touched = await system.lifecycle.get("sbx-time", owner="alice")
    assert touched.deadline is not None and touched.deadline >= shorter.deadline
    (announced,) = system.publisher.of_type(SandboxTimeoutSet)
    assert announced.deadline == shorter.deadline
    (activity,) = system.publisher.of_type(SandboxActivity)
    assert activity.generation == touched.generation


async def test_activity_seen_before_a_set_timeout_does_not_undo_it(system: InMemorySystem) -> None:
    """A proxied request's touch lands after the client's ``set_timeout(0)``: the sandbox still
    expires now (it came back 60 s later, E2B's test_keep_memory_none... waited in vain)."""
    await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-late", timeout=60))
    seen = datetime.now(UTC)
    expired = await system.lifecycle.set_timeout("sbx-late", owner="alice", timeout=0)
    await system.lifecycle.touch("sbx-late", seen_at=seen)
    assert (await system.lifecycle.get("sbx-late", owner="alice")).deadline == expired.deadline
    # Nor an activity event: the scheduler would extend the deadline by it.
    assert system.publisher.of_type(SandboxActivity) == []
    # Activity seen after it counts again.
    await system.lifecycle.touch("sbx-late", seen_at=datetime.now(UTC) + timedelta(seconds=1))
    later = await system.lifecycle.get("sbx-late", owner="alice")
    assert later.deadline is not None and expired.deadline is not None
    assert later.deadline > expired.deadline


async def test_a_touch_applied_before_a_set_timeout_reports_when_it_was_seen(
    system: InMemorySystem,
) -> None:
    """The touch lands first, the client's ``set_timeout(0)`` next, then the activity event goes
    out: it carries the time the request was seen (not now), so the scheduler refuses it."""
    await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-ev", timeout=60))
    seen = datetime.now(UTC) - timedelta(milliseconds=50)
    await system.lifecycle.touch("sbx-ev", seen_at=seen)
    (activity,) = system.publisher.of_type(SandboxActivity)
    assert activity.at == seen


async def test_unknown_template_fails_the_create_at_once(system: InMemorySystem) -> None:
    with pytest.raises(RuntimeFailure, match="template missing not found"):
        await system.lifecycle.create(
            CreateRequest(owner="alice", sandbox_id="sbx-tpl", template="missing"), wait=5
        )
    rec = await system.store.get("sbx-tpl")
    assert rec is not None and rec.state == SandboxState.FAILED
    assert rec.failure is not None and rec.failure.startswith("create:")


async def test_never_ready_template_fails_the_create_at_once_and_removes_the_pod(
    system: InMemorySystem,
) -> None:
    """Not retried until the API's wait ends in 504: the ready command's reason, failed."""
    system.runtime.ready_failure = "ready command failed: exit 3: not yet"
    with pytest.raises(RuntimeFailure, match="exit 3: not yet"):
        await system.lifecycle.create(
            CreateRequest(owner="alice", sandbox_id="sbx-unready", template="base"), wait=5
        )
    rec = await system.store.get("sbx-unready")
    assert rec is not None and rec.state == SandboxState.FAILED
    assert rec.failure is not None and "ready command failed: exit 3" in rec.failure
    assert "sbx-unready" not in system.runtime.workloads
    failed = [p for p in system.publisher.published if p.verb == "failed"]
    assert len(failed) == 1


@pytest.mark.parametrize("sandbox_id", ["Not_Valid!", "--ro-bind", "a\x00b", "x" * 300])
async def test_invalid_sandbox_id_is_refused(system: InMemorySystem, sandbox_id: str) -> None:
    with pytest.raises(ValueError, match="invalid sandbox id"):
        await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id=sandbox_id))
    assert system.publisher.published == []
