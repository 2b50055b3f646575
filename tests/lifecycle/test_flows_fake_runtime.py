"""Pause/resume/kill flows through the real bus and the real handlers, with fake pods.

NATS is real (a private server per test); the runtime and the daemon are the in-memory fakes, so
these tests isolate the bus choreography, the state machine and the idempotency rules.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator

import pytest

from shared.domain.states import SandboxState
from shared.errors import IllegalTransition, NotFound, RuntimeFailure, SnapshotTooLarge
from shared.models.snapshots import ProcessConfig, SnapshotProcess
from shared.ports.lifecycle import CreateRequest
from shared.ports.workloads import ANNOTATION_RESUME_MEMORY, ANNOTATION_SNAPSHOT, Endpoint
from tests.fakes.runtime import FakeEnvd, FakeRuntime
from tests.lifecycle.harness import System, running_system

SERVER = SnapshotProcess(
    config=ProcessConfig(
        cmd="/bin/bash", args=["-l", "-c", "python3 server.py > service.log 2>&1"], cwd="/workspace"
    ),
    pid=20,
)


@pytest.fixture
async def system(fresh_nats) -> AsyncIterator[System]:  # type: ignore[no-untyped-def]
    async with running_system(fresh_nats.url, FakeRuntime(), FakeEnvd()) as s:
        yield s


async def _start_process(system: System, sid: str, proc: SnapshotProcess) -> None:
    record = await system.store.get(sid)
    assert record is not None and record.host and record.pod_uid
    await system.envd.start_process(  # type: ignore[attr-defined]
        Endpoint(host=record.host, pod_uid=record.pod_uid),
        proc.config,
        tag=proc.tag,
        access_token=None,
    )


async def test_create_pause_resume_cycle(system: System) -> None:
    runtime: FakeRuntime = system.runtime  # type: ignore[assignment]
    envd: FakeEnvd = system.envd  # type: ignore[assignment]
    rec = await system.lifecycle.create(
        CreateRequest(owner="alice", sandbox_id="sbx-cycle", timeout=300)
    )
    assert rec.state == SandboxState.RUNNING and rec.generation == 1 and rec.deadline is not None
    first_pod = rec.pod_uid
    await _start_process(system, "sbx-cycle", SERVER)

    paused = await system.lifecycle.pause("sbx-cycle", owner="alice", wait=10)
    assert paused.state == SandboxState.PAUSED and paused.generation == 2
    assert paused.host is None and paused.deadline is None and paused.retain_until is not None
    wl = runtime.workloads["sbx-cycle"]
    assert wl.replicas == 0 and wl.pod_uid is None
    doc = json.loads(base64.b64decode(wl.annotations[ANNOTATION_SNAPSHOT]))
    assert doc["processes"] == [
        {
            "config": {"cmd": "/bin/bash", "args": SERVER.config.args, "cwd": "/workspace"},
            "pid": 100,
        }
    ]
    assert doc["captured_time"].endswith("Z")
    assert (
        paused.snapshot is not None
        and paused.snapshot.annotation == wl.annotations[ANNOTATION_SNAPSHOT]
    )

    with pytest.raises(IllegalTransition):
        await system.lifecycle.pause("sbx-cycle", owner="alice", wait=5)

    result = await system.lifecycle.resume("sbx-cycle", owner="alice", wait=10)
    assert result.resumed and result.record.state == SandboxState.RUNNING
    assert result.record.generation == 3 and result.record.pod_uid != first_pod
    new_pod = result.record.pod_uid
    assert new_pod is not None
    assert [p.config.args for p in envd.pods[new_pod]] == [SERVER.config.args]
    assert envd.started[new_pod] == 1
    # The annotation and the record keep showing the last snapshot after the resume.
    assert (
        runtime.workloads["sbx-cycle"].annotations[ANNOTATION_SNAPSHOT]
        == paused.snapshot.annotation
    )
    assert result.record.snapshot == paused.snapshot

    again = await system.lifecycle.resume("sbx-cycle", owner="alice", wait=5)
    assert not again.resumed and envd.started[new_pod] == 1


async def test_a_resume_may_change_whether_the_sandbox_pauses_on_timeout(system: System) -> None:
    """The scaler applies the resume's ``auto_pause`` with the new generation; an absent one
    keeps the record's, and create's ``auto_pause_memory`` stays across both."""
    request = CreateRequest(owner="alice", sandbox_id="sbx-ap", auto_pause=True)
    rec = await system.lifecycle.create(request.model_copy(update={"auto_pause_memory": True}))
    assert rec.auto_pause and rec.auto_pause_memory
    for sent, kept in ((False, False), (None, False), (True, True)):
        await system.lifecycle.pause("sbx-ap", owner="alice", wait=10)
        result = await system.lifecycle.resume("sbx-ap", owner="alice", auto_pause=sent, wait=10)
        assert result.resumed and result.record.state == SandboxState.RUNNING
        assert result.record.auto_pause is kept and result.record.auto_pause_memory


async def test_each_resume_tells_the_runtime_whether_to_restore_memory(system: System) -> None:
    """``memory=False`` (E2B's reboot) marks the workload for the runtime; the next plain
    resume marks it back, so one resume's choice never carries over."""
    runtime: FakeRuntime = system.runtime  # type: ignore[assignment]
    await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-rm"))
    seen = []
    for memory in (None, False, None, True):
        await system.lifecycle.pause("sbx-rm", owner="alice", wait=10, memory=True)
        result = await system.lifecycle.resume("sbx-rm", owner="alice", memory=memory, wait=10)
        assert result.resumed and result.record.state == SandboxState.RUNNING
        seen.append(runtime.workloads["sbx-rm"].annotations.get(ANNOTATION_RESUME_MEMORY))
    assert seen == [None, "false", "true", "true"]


async def test_unknown_and_foreign_sandboxes_are_not_found(system: System) -> None:
    with pytest.raises(NotFound):
        await system.lifecycle.pause("nope", owner="alice")
    await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-mine"))
    with pytest.raises(NotFound):
        await system.lifecycle.get("sbx-mine", owner="bob")
    with pytest.raises(NotFound):
        await system.lifecycle.resume("sbx-mine", owner="bob")


async def test_kill_leaves_tombstone_and_id_can_be_reused(system: System) -> None:
    runtime: FakeRuntime = system.runtime  # type: ignore[assignment]
    await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-kill"))
    await system.lifecycle.pause("sbx-kill", owner="alice", wait=10)
    await system.lifecycle.kill("sbx-kill", owner="alice", wait=10)
    assert "sbx-kill" not in runtime.workloads
    tomb = await system.store.get("sbx-kill")
    assert tomb is not None and tomb.state == SandboxState.KILLED
    with pytest.raises(NotFound):
        await system.lifecycle.get("sbx-kill", owner="alice")
    assert all(r.sandbox_id != "sbx-kill" for r in await system.lifecycle.list(owner="alice"))
    again = await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-kill"))
    assert again.state == SandboxState.RUNNING and again.generation > tomb.generation


async def test_daemon_down_fails_the_pause_and_keeps_the_pod(system: System) -> None:
    runtime: FakeRuntime = system.runtime  # type: ignore[assignment]
    envd: FakeEnvd = system.envd  # type: ignore[assignment]
    rec = await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-down"))
    envd.down = True
    with pytest.raises(RuntimeFailure, match="daemon down"):
        await system.lifecycle.pause("sbx-down", owner="alice", wait=30)
    failed = await system.store.get("sbx-down")
    assert failed is not None and failed.state == SandboxState.FAILED
    assert failed.failure is not None and "pause" in failed.failure
    assert runtime.workloads["sbx-down"].pod_uid == rec.pod_uid  # never scaled down
    # A failed sandbox can be resumed: same pod, nothing replayed, running again.
    envd.down = False
    result = await system.lifecycle.resume("sbx-down", owner="alice", wait=10)
    assert result.record.state == SandboxState.RUNNING and result.record.pod_uid == rec.pod_uid
    assert envd.started.get(rec.pod_uid or "", 0) == 0


async def test_snapshot_too_large_fails_the_pause_without_retrying(system: System) -> None:
    runtime: FakeRuntime = system.runtime  # type: ignore[assignment]
    rec = await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-big"))
    big = SnapshotProcess(
        config=ProcessConfig(cmd="/bin/true", args=[], envs={"BLOB": "x" * 300_000}), pid=5
    )
    await _start_process(system, "sbx-big", big)
    with pytest.raises(RuntimeFailure, match="annotation budget"):
        await system.lifecycle.pause("sbx-big", owner="alice", wait=10)
    assert runtime.workloads["sbx-big"].pod_uid == rec.pod_uid
    assert ("sbx-big", 0) not in runtime.scale_calls


async def test_kept_files_that_cannot_be_stored_fail_the_pause_and_keep_the_pod(
    system: System,
) -> None:
    """A ``persist: store`` pause whose upload is refused (the store too small for the files)
    never stops the pod; the next pause, with room again, keeps them and pauses."""
    runtime: FakeRuntime = system.runtime  # type: ignore[assignment]
    rec = await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-keep"))
    runtime.keep_failure = SnapshotTooLarge("kept files of sbx-keep are over the disk size")
    with pytest.raises(RuntimeFailure, match="over the disk size"):
        await system.lifecycle.pause("sbx-keep", owner="alice", wait=10)
    assert runtime.workloads["sbx-keep"].pod_uid == rec.pod_uid
    assert ("sbx-keep", 0) not in runtime.scale_calls
    runtime.keep_failure = None
    result = await system.lifecycle.resume("sbx-keep", owner="alice", wait=10)  # from failed
    assert result.record.state == SandboxState.RUNNING
    paused = await system.lifecycle.pause("sbx-keep", owner="alice", wait=10)
    assert paused.state == SandboxState.PAUSED
    assert runtime.kept == ["sbx-keep"]
    assert ("sbx-keep", 0) in runtime.scale_calls


async def test_failing_process_is_reported_and_sandbox_still_resumes(system: System) -> None:
    envd: FakeEnvd = system.envd  # type: ignore[assignment]
    await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-partial"))
    broken = SnapshotProcess(config=ProcessConfig(cmd="/nonexistent", args=["x"]), pid=7, tag="t1")
    await _start_process(system, "sbx-partial", broken)
    await _start_process(system, "sbx-partial", SERVER)
    await system.lifecycle.pause("sbx-partial", owner="alice", wait=10)
    envd.fail_cmds.add("/nonexistent")
    result = await system.lifecycle.resume("sbx-partial", owner="alice", wait=10)
    assert result.record.state == SandboxState.RUNNING
    pod = result.record.pod_uid or ""
    assert [p.config.cmd for p in envd.pods[pod]] == ["/bin/bash"]


async def test_timeouts_move_the_deadline_and_announce_it(system: System, fresh_nats) -> None:  # type: ignore[no-untyped-def]
    import nats

    rec = await system.lifecycle.create(
        CreateRequest(owner="alice", sandbox_id="sbx-time", timeout=300)
    )
    assert rec.deadline is not None
    shorter = await system.lifecycle.set_timeout("sbx-time", owner="alice", timeout=60)
    assert shorter.timeout == 60
    assert shorter.deadline is not None
    assert shorter.deadline < rec.deadline
    same = await system.lifecycle.extend_timeout("sbx-time", owner="alice", timeout=10)
    assert same.deadline == shorter.deadline  # connect never shortens
    await system.lifecycle.touch("sbx-time")
    touched = await system.lifecycle.get("sbx-time", owner="alice")
    assert touched.deadline is not None
    assert touched.deadline >= shorter.deadline
    nc = await nats.connect(fresh_nats.url)
    try:
        js = nc.jetstream()
        timeout_set = await js.get_last_msg("SANDBOX_EVT", "sandbox.evt.timeout_set.sbx-time")
        activity = await js.get_last_msg("SANDBOX_EVT", "sandbox.evt.activity.sbx-time")
    finally:
        await nc.close()
    assert json.loads(timeout_set.data)["deadline"].startswith(shorter.deadline.isoformat()[:19])
    assert json.loads(activity.data)["generation"] == touched.generation
    with pytest.raises(NotFound):
        await system.lifecycle.set_timeout("sbx-time", owner="bob", timeout=60)


async def test_unknown_template_fails_the_create_at_once(system: System) -> None:
    with pytest.raises(RuntimeFailure, match="template missing not found"):
        await system.lifecycle.create(
            CreateRequest(owner="alice", sandbox_id="sbx-tpl", template="missing"), wait=5
        )
    rec = await system.store.get("sbx-tpl")
    assert rec is not None
    assert rec.state == SandboxState.FAILED
    assert rec.failure is not None
    assert rec.failure.startswith("create:")


async def test_invalid_sandbox_id_is_refused(system: System) -> None:
    with pytest.raises(ValueError, match="invalid sandbox id"):
        await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="Not_Valid!"))
