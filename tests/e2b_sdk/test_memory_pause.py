"""E2B's memory-keeping pause through the unmodified SDK on the real stack (local runtime, CRIU):
``pause(mode="full")`` sends ``memory: true``, the snapshotter marks the workload
(``torpor.dev/pause-memory``), the runtime dumps the pod and restores it on connect, and the
scaler replays nothing: the same process (same pid) still holds the same random token it only
keeps in memory. A plain pause still replays (a new process, a new token); hostile pause bodies
are refused with a JSON 400."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from tests.conftest import skip_or_fail
from tests.support.stack import Stack
from tests.support.waiting import until

pytestmark = pytest.mark.slow

# Keeps a random token in a variable only; on SIGUSR1 (and once at start) writes "<pid> <token>".
_HOLDER = """
import os, secrets, signal
token = secrets.token_hex(16)
def tell(*_):
    with open('/tmp/holder.tmp', 'w') as f:
        f.write(f'{os.getpid()} {token}')
    os.replace('/tmp/holder.tmp', '/tmp/holder')
signal.signal(signal.SIGUSR1, tell)
tell()
while True:
    signal.pause()
"""


@pytest.fixture
def api(stack: Stack) -> Iterator[httpx.Client]:
    with stack.client("alice") as client:
        yield client


def _start_holder(s: Sandbox) -> None:
    s.commands.run(f"python3 -c {shlex.quote(_HOLDER)}", background=True, timeout=0)
    until(lambda: s.files.exists("/tmp/holder"), 30, what="the holder started")


def _ask(s: Sandbox, pid: int | None = None) -> tuple[int, str]:
    """The holder's pid and token, as it says them now (the file is written anew); ``pid``:
    ask that process (else the one the file names)."""
    if pid is None:
        pid = int(s.files.read("/tmp/holder").split()[0])
    s.commands.run(f"rm -f /tmp/holder && kill -USR1 {pid}")
    until(lambda: s.files.exists("/tmp/holder"), 30, what="the holder answered")
    new_pid, token = s.files.read("/tmp/holder").split()
    return int(new_pid), token


def _report(api: httpx.Client, sid: str) -> dict[str, Any]:
    report: dict[str, Any] = api.get(f"/api/v1/sandbox/{sid}").json()["lastResume"]
    return report


def test_a_memory_pause_keeps_the_process_and_its_memory(
    opts: dict[str, Any], api: httpx.Client
) -> None:
    s = Sandbox.create(template="base", timeout=180, **opts)
    try:
        _start_holder(s)
        before = _ask(s)
        s.pause(mode="full")  # the body's memory: true

        resumed = Sandbox.connect(s.sandbox_id, **opts)
        report = _report(api, s.sandbox_id)
        if not report["memoryKept"] and "CRIU is not usable" in (report["memoryNote"] or ""):
            skip_or_fail(report["memoryNote"])
        assert report["memoryKept"] is True, report
        assert report["memoryNote"] is None
        (proc,) = report["processes"]  # reported as still running, not started again
        assert proc["error"] is None and proc["newPid"] == proc["oldPid"]
        # Not replayed: the same process answers with the token it kept in memory.
        assert _ask(resumed) == before
        holders = [p for p in resumed.commands.list() if "secrets" in " ".join(p.args)]
        assert len(holders) == 1, holders
    finally:
        Sandbox.kill(s.sandbox_id, **opts)


def test_a_reboot_connect_drops_the_memory_and_replays_once(
    opts: dict[str, Any], api: httpx.Client
) -> None:
    """``connect(on_resume="reboot")`` (``memory: false``) after a memory pause boots from the
    kept files and replays; the next memory pause and plain connect restore memory again."""
    s = Sandbox.create(template="base", timeout=180, **opts)
    try:
        _start_holder(s)
        _, token = _ask(s)
        s.files.remove("/tmp/holder")
        s.pause(mode="full")

        rebooted = Sandbox.connect(s.sandbox_id, on_resume="reboot", **opts)
        report = _report(api, s.sandbox_id)
        assert report["memoryKept"] is False, report
        assert "booted from the kept files" in (report["memoryNote"] or ""), report
        assert report["replayed"] == 1 and report["failed"] == 0, report
        until(lambda: rebooted.files.exists("/tmp/holder"), 30, what="the replay")
        pid, new_token = _ask(rebooted)
        assert new_token != token

        rebooted.pause(mode="full")
        restored = Sandbox.connect(s.sandbox_id, **opts)
        report = _report(api, s.sandbox_id)
        if not report["memoryKept"] and "CRIU is not usable" in (report["memoryNote"] or ""):
            skip_or_fail(report["memoryNote"])
        assert report["memoryKept"] is True, report
        assert _ask(restored, pid) == (pid, new_token)
    finally:
        Sandbox.kill(s.sandbox_id, **opts)


_LOCKER = (
    "import fcntl, time\n"
    "f = open('/tmp/lockfile', 'w')\n"
    "fcntl.flock(f, fcntl.LOCK_EX)\n"
    "open('/tmp/locked', 'w').write('1')\n"
    "time.sleep(100000)\n"
)


def test_a_memory_pause_keeps_a_processs_file_lock(opts: dict[str, Any], api: httpx.Client) -> None:
    """A process holding a flock is dumped with it (CRIU's --file-locks) and holds it after the
    restore: another process still cannot take it."""
    s = Sandbox.create(template="base", timeout=180, **opts)
    try:
        s.commands.run(f"python3 -c {shlex.quote(_LOCKER)}", background=True, timeout=0)
        until(lambda: s.files.exists("/tmp/locked"), 30, what="the lock taken")
        s.pause(mode="full")

        resumed = Sandbox.connect(s.sandbox_id, **opts)
        report = _report(api, s.sandbox_id)
        if not report["memoryKept"] and "CRIU is not usable" in (report["memoryNote"] or ""):
            skip_or_fail(report["memoryNote"])
        assert report["memoryKept"] is True, report["memoryNote"]
        probe = resumed.commands.run("flock -n /tmp/lockfile true; echo $?")
        assert probe.stdout.strip() == "1", probe  # still held by the restored process
    finally:
        Sandbox.kill(s.sandbox_id, **opts)


def test_a_plain_pause_replays(opts: dict[str, Any], api: httpx.Client) -> None:
    s = Sandbox.create(template="base", timeout=180, **opts)
    try:
        _start_holder(s)
        _, token = _ask(s)
        s.files.remove("/tmp/holder")  # the files are kept: the replayed holder writes it anew
        s.pause()  # no memory in the body: files only

        resumed = Sandbox.connect(s.sandbox_id, **opts)
        report = _report(api, s.sandbox_id)
        assert report["memoryKept"] is False and "started again" in report["memoryNote"]
        assert report["replayed"] == 1 and report["failed"] == 0
        # Started again from its command line: a new process with a new token.
        until(lambda: resumed.files.exists("/tmp/holder"), 30, what="the replay")
        assert _ask(resumed)[1] != token
    finally:
        Sandbox.kill(s.sandbox_id, **opts)


def _state(api: httpx.Client, sid: str) -> str:
    return str(api.get(f"/api/v1/sandbox/{sid}").json()["state"])


@pytest.mark.parametrize(("mode", "kept"), [("full", True), ("filesystem", False)])
def test_a_timeout_pause_keeps_memory_as_the_sandbox_was_created(
    opts: dict[str, Any], api: httpx.Client, mode: str, kept: bool
) -> None:
    """``lifecycle={"on_timeout": {"action": "pause", "mode": ...}}`` (``autoPauseMemory`` on the
    wire) decides what the timeout's pause keeps: the same process and token, or a replay."""
    lifecycle: Any = {"on_timeout": {"action": "pause", "mode": mode}}
    s = Sandbox.create(template="base", timeout=8, lifecycle=lifecycle, **opts)
    try:
        _start_holder(s)
        before = _ask(s)
        s.files.remove("/tmp/holder")  # a replayed holder writes it anew; a kept one does not
        until(lambda: _state(api, s.sandbox_id) == "paused", 120, what="the timeout pause")

        resumed = Sandbox.connect(s.sandbox_id, timeout=180, **opts)
        report = _report(api, s.sandbox_id)
        if (
            kept
            and not report["memoryKept"]
            and "CRIU is not usable" in (report["memoryNote"] or "")
        ):
            skip_or_fail(report["memoryNote"])
        assert report["memoryKept"] is kept, report
        if kept:
            assert report["memoryNote"] is None, report
            (proc,) = report["processes"]  # still running under its pid, not started again
            assert proc["error"] is None and proc["newPid"] == proc["oldPid"], report
            assert not resumed.files.exists("/tmp/holder")  # the same process, not a new one
            assert _ask(resumed, before[0]) == before
        else:
            assert report["replayed"] == 1 and "started again" in report["memoryNote"], report
            until(lambda: resumed.files.exists("/tmp/holder"), 30, what="the replay")
            assert _ask(resumed)[1] != before[1]
    finally:
        Sandbox.kill(s.sandbox_id, **opts)


@pytest.mark.parametrize(
    "body",
    [
        {"memory": "true"},
        {"memory": 1},
        {"memory": None},
        {"memory": True, "snapshotMemory": True},
        {"memroy": True},
        ["memory"],
    ],
)
def test_hostile_pause_bodies_are_refused(sbx: Sandbox, api: httpx.Client, body: Any) -> None:
    r = api.post(f"/sandboxes/{sbx.sandbox_id}/pause", json=body)
    assert r.status_code == 400, (r.status_code, r.text)
    assert isinstance(r.json()["message"], str)
    assert sbx.is_running()
