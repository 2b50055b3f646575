"""The resume report in memory (real lifecycle, snapshotter and scaler routers; fake runtime and
daemon): every snapshot process with its old and new pid or its error, on the record, in the
``resumed`` event, and the same again when a redelivered resume republishes the event."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from services.scaler.scaling import Scaler
from shared.models.messages import ResumeSandbox, SandboxResumed, msg_id
from shared.models.snapshots import ProcessConfig
from shared.ports.lifecycle import CreateRequest
from shared.ports.workloads import ANNOTATION_PAUSE_MEMORY, Endpoint
from tests.fakes.publisher import RecordingPublisher
from tests.fakes.system import InMemorySystem, in_memory_system

pytestmark = pytest.mark.unit

SERVER = ProcessConfig(cmd="/bin/bash", args=["-l", "-c", "python3 server.py"], cwd="/workspace")
BROKEN = ProcessConfig(cmd="/nonexistent", args=["--ro-bind", "token=sk-secretsecretsecret"])


@pytest.fixture
async def system() -> AsyncIterator[InMemorySystem]:
    async with in_memory_system() as s:
        yield s


async def _start(system: InMemorySystem, sid: str, config: ProcessConfig, tag: str | None) -> int:
    record = await system.store.get(sid)
    assert record is not None and record.host and record.pod_uid
    endpoint = Endpoint(host=record.host, pod_uid=record.pod_uid)
    return await system.envd.start_process(endpoint, config, tag=tag, access_token=None)


async def test_report_lists_each_process_with_old_and_new_pid_or_error(
    system: InMemorySystem,
) -> None:
    sid = "sbx-report"
    await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id=sid))
    server_pid = await _start(system, sid, SERVER, "web")
    broken_pid = await _start(system, sid, BROKEN, None)
    paused = await system.lifecycle.pause(sid, owner="alice", wait=5)
    assert paused.snapshot is not None
    system.envd.fail_cmds.add("/nonexistent")

    result = await system.lifecycle.resume(sid, owner="alice", wait=5)
    report = result.record.last_resume
    assert report is not None
    assert report.snapshot_id == paused.snapshot.id and report.template == "sandbox-base"
    assert report.files_kept is True and (report.replayed, report.failed) == (1, 1)
    # A replay loses memory, and the report says so rather than leaving it to be found out.
    assert report.memory_kept is False
    assert report.memory_note is not None and "started again" in report.memory_note
    web, broken = report.processes
    assert (web.tag, web.old_pid, web.error) == ("web", server_pid, None)
    live = system.envd.pods[result.record.pod_uid or ""]
    assert web.new_pid == live[0].pid and web.new_pid != server_pid
    assert (broken.old_pid, broken.new_pid) == (broken_pid, None)
    assert broken.error is not None and "FileNotFoundError" in broken.error
    assert report.timings.total_ms >= report.timings.pod_ms >= 0

    (event,) = system.publisher.of_type(SandboxResumed)
    assert event.report == report and event.processes == report.processes
    assert "sk-secretsecretsecret" not in (broken.error or "")

    # A redelivered command finding the resume done republishes the report from the record.
    publisher = RecordingPublisher()
    scaler = Scaler(
        store=system.store, runtime=system.runtime, envd=system.envd, publisher=publisher
    )
    again = ResumeSandbox(sandbox_id=sid, generation=paused.generation)
    assert await scaler.resume(again, msg_id("resume", sid, paused.generation)) == "skipped"
    (republished,) = publisher.of_type(SandboxResumed)
    assert republished.report == report


async def test_a_never_paused_sandbox_has_no_report(system: InMemorySystem) -> None:
    rec = await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-fresh"))
    assert rec.last_resume is None


def test_the_report_lists_processes_within_its_budget() -> None:
    """A snapshot near its 200 KiB budget must not push the record past the bucket's 256 KiB."""
    from services.scaler.reports import within_budget
    from shared.models.messages import REPORT_PROCESS_BYTES, ProcessOutcome

    big = [
        ProcessOutcome(cmd="/bin/bash", args=["-c", "x" * 4000], old_pid=i, new_pid=i + 1)
        for i in range(60)
    ]
    listed = within_budget(big)
    assert 0 < len(listed) < len(big) and listed == big[: len(listed)]
    assert sum(len(o.model_dump_json()) for o in listed) <= REPORT_PROCESS_BYTES
    assert within_budget(big[:3]) == big[:3]


async def test_a_memory_pause_marks_the_workload_and_a_restored_pod_is_not_replayed(
    system: InMemorySystem,
) -> None:
    """``memory=True`` reaches the workload (``torpor.dev/pause-memory``); a pod the runtime
    brings back with its memory gets no replay and the report says memory was kept; the next
    plain pause sets it back to files only and replays."""
    system.runtime.keeps_memory = True
    sid = "sbx-memory"
    await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id=sid))
    server_pid = await _start(system, sid, SERVER, "web")
    await system.lifecycle.pause(sid, owner="alice", wait=5, memory=True)
    assert system.runtime.workloads[sid].annotations[ANNOTATION_PAUSE_MEMORY] == "true"

    result = await system.lifecycle.resume(sid, owner="alice", wait=5)
    report = result.record.last_resume
    assert report is not None and report.memory_kept is True and report.memory_note is None
    pod = result.record.pod_uid or ""
    assert system.envd.started[pod] == 1  # the one start before the pause: nothing replayed
    (web,) = report.processes
    assert (web.old_pid, web.new_pid, web.error) == (server_pid, server_pid, None)
    assert (report.replayed, report.failed) == (1, 0)

    await system.lifecycle.pause(sid, owner="alice", wait=5)
    assert system.runtime.workloads[sid].annotations[ANNOTATION_PAUSE_MEMORY] == "false"
    again = (await system.lifecycle.resume(sid, owner="alice", wait=5)).record.last_resume
    assert again is not None and again.memory_kept is False and again.replayed == 1
    assert again.memory_note is not None and "started again" in again.memory_note
