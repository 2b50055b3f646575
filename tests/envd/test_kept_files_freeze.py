"""``GET /kept-files?hold=`` stops the sandbox's processes for the export (``services.envd
.freezing``) on a real daemon: a process appending to a file in the home every few ms is
stopped (``T``) before the tar is taken, the tar's copy equals the file as it is right after,
it stays stopped for the hold and moves again after ``POST /kept-files/thaw`` or when the hold
runs out. Twice: the daemon bare on the host (its descendants only: a process of the host that
is not one is never stopped) and in a PID namespace of its own (bubblewrap, as in every pod:
the whole namespace, a process that left the daemon's tree too). Plus hostile ``hold`` values,
a process the user stopped (a thaw leaves it stopped), a stopping daemon killing what it holds,
and the refusals: a ``/proc`` of another namespace, passes that never settle."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, SandboxException

from services.envd.freezing import read_stat
from services.envd.holding import HELD_MESSAGE
from tests.conftest import skip_or_fail
from tests.envd.conftest import REPO, TOKEN, Daemon, start_daemon, stop_daemon

AUTH = {"X-Access-Token": TOKEN}
WAIT = 15.0  # seconds: a bound for what should take milliseconds on a quiet machine


@dataclass
class Rig:
    daemon: Daemon
    kept: Path
    sbx: Sandbox
    outsider: subprocess.Popen[bytes]  # the host's, not the daemon's: never stopped


def _wait_for(check: Callable[[], bool], within: float = WAIT) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def _state(pid: int) -> str:
    st = read_stat(pid)
    return "gone" if st is None else st.state


def _held(pid: int) -> bool:
    """Stopped: ``T``, or a ``vfork`` parent (``D``) whose child was stopped before its exec
    (the loop's shell starts each ``sleep`` so): it runs no code until that child is continued."""
    st = read_stat(pid)
    if st is None or st.state not in ("T", "D"):
        return False
    if st.state == "T":
        return True
    pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    return any((c := read_stat(p)) is not None and c.ppid == pid and c.state == "T" for p in pids)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _host_pids(marker: str) -> list[int]:
    """Host pids of the processes whose command line holds ``marker`` (either namespace)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(name))
    return found


def _rig(base: Path, control_plane: str, *, pid_namespace: bool) -> Iterator[Rig]:
    kept = base / "kept"
    for top in ("home/user", "workspace"):
        (kept / top).mkdir(parents=True)
    prefix: tuple[str, ...] = ()
    if pid_namespace:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            skip_or_fail("bubblewrap (bwrap) is missing: apt-get install -y bubblewrap")
        assert bwrap is not None
        prefix = (bwrap, "--unshare-pid", "--die-with-parent", "--dev-bind", "/", "/")
        prefix += ("--proc", "/proc", "--")
    daemon = start_daemon(base, base / "envd.log", extra=("--kept-root", str(kept)), prefix=prefix)
    outsider = subprocess.Popen(["sleep", "600"])
    sbx = Sandbox.create(
        template="sandbox-base", api_key="k", api_url=control_plane, sandbox_url=daemon.url
    )
    try:
        yield Rig(daemon, kept, sbx, outsider)
    finally:
        outsider.kill()
        outsider.wait()
        stop_daemon(daemon)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, control_plane: str) -> Iterator[Rig]:
    yield from _rig(tmp_path_factory.mktemp("freeze-host"), control_plane, pid_namespace=False)


@pytest.fixture(scope="module")
def pidns(tmp_path_factory: pytest.TempPathFactory, control_plane: str) -> Iterator[Rig]:
    yield from _rig(tmp_path_factory.mktemp("freeze-pidns"), control_plane, pid_namespace=True)


@pytest.fixture
def writers() -> Iterator[list[int]]:
    """Host pids of the test's writers: their process groups are killed after it."""
    started: list[int] = []
    yield started
    for pid in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)


def _writer(rig: Rig, writers: list[int], *, detached: bool = False) -> tuple[Path, int]:
    """A process appending numbered lines to a file of the home every ~10 ms; the file and its
    host pid. ``detached``: started by a shell that exits at once, so it is no longer the
    daemon's descendant (re-parented to the namespace's PID 1)."""
    marker = f"freeze-{uuid.uuid4().hex[:12]}"
    target = rig.kept / "home/user" / f"{marker}.log"
    loop = f'i=0; while :; do i=$((i+1)); echo "line $i {marker}" >> {target}; sleep 0.01; done'
    script = f"({loop}) >/dev/null 2>&1 &" if detached else loop
    rig.sbx.commands.run(script, background=True, timeout=0)
    assert _wait_for(lambda: target.exists() and target.stat().st_size > 100), "writer silent"
    pids = [p for p in _host_pids(marker) if _state(p) not in ("Z", "gone")]
    assert pids, f"no process of {marker}"
    writers.extend(pids)
    # The loop's own shell: the one whose parent is not the loop's. Not the newest pid: that
    # may be the loop's fork for a ``sleep`` (its command line the loop's until the exec),
    # gone by the time it is looked at.
    parents = {p: st.ppid for p in pids if (st := read_stat(p)) is not None}
    (loop_shell,) = [p for p, ppid in parents.items() if ppid not in parents]
    return target, loop_shell


def _export(rig: Rig, **params: str) -> httpx.Response:
    return httpx.get(f"{rig.daemon.url}/kept-files", params=params, headers=AUTH, timeout=60)


def _thaw(rig: Rig) -> httpx.Response:
    return httpx.post(f"{rig.daemon.url}/kept-files/thaw", headers=AUTH, timeout=30)


def _member(tar_bytes: bytes, path: Path, kept: Path) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        fh = tar.extractfile(str(path.relative_to(kept)))
        assert fh is not None
        return fh.read()


def _grows(path: Path) -> Callable[[], bool]:
    size = path.stat().st_size
    return lambda: path.stat().st_size > size


@pytest.mark.parametrize("mode", ["host", "pidns"])
def test_a_held_export_is_the_file_as_it_stays(
    request: pytest.FixtureRequest, mode: str, writers: list[int]
) -> None:
    rig: Rig = request.getfixturevalue(mode)
    target, pid = _writer(rig, writers)
    detached = None
    if mode == "pidns":  # outside the daemon's tree, inside its namespace: stopped as well
        detached = _writer(rig, writers, detached=True)
    answer = _export(rig, hold="30")
    try:
        assert answer.status_code == 200, answer.text
        assert int(answer.headers["x-frozen-processes"]) >= 1
        assert _held(pid)
        exported = _member(answer.content, target, rig.kept)
        assert exported == target.read_bytes()  # nothing written during the export or after
        assert exported.endswith(b"\n") and exported.count(b"\n") > 3
        if detached is not None:
            assert _held(detached[1])
            assert _member(answer.content, detached[0], rig.kept) == detached[0].read_bytes()
        assert _state(rig.outsider.pid) in ("S", "R")  # the host's process moves on
        assert _state(os.getpid()) in ("S", "R")

        # Another export meanwhile (a redelivered pause, a snapshot): the same tree, and one
        # without a hold does not end the running one.
        again = _export(rig, hold="0")
        assert again.status_code == 200, again.text
        assert _member(again.content, target, rig.kept) == exported
        assert _held(pid)
    finally:
        thawed = _thaw(rig)
    assert thawed.status_code == 200, thawed.text
    assert thawed.json()["continued"] >= 1
    assert _wait_for(_grows(target)), "the writer did not move again after the thaw"
    if detached is not None:
        assert _wait_for(_grows(detached[0]))
    assert _thaw(rig).json() == {"continued": 0}  # nothing held any more


def test_the_hold_runs_out_by_itself(host: Rig, writers: list[int]) -> None:
    """Continued by the daemon itself (its log says so), not by a thaw: no state is checked
    right after the export, which a loaded machine could delay past a short hold."""
    target, pid = _writer(host, writers)
    answer = _export(host, hold="1")
    assert answer.status_code == 200, answer.text
    assert int(answer.headers["x-frozen-processes"]) >= 1
    assert _wait_for(lambda: _state(pid) != "T"), "still stopped after its hold"
    assert _wait_for(_grows(target))
    over = re.findall(r"hold over, (\d+) processes continued", host.daemon.log.read_text())
    assert over and int(over[-1]) >= 1


def test_without_hold_the_processes_move_on_after_the_export(host: Rig, writers: list[int]) -> None:
    target, pid = _writer(host, writers)
    answer = _export(host)
    assert answer.status_code == 200, answer.text
    assert int(answer.headers["x-frozen-processes"]) >= 1
    assert _wait_for(lambda: _state(pid) != "T")
    assert _wait_for(_grows(target))


def test_a_process_the_user_stopped_stays_stopped(host: Rig, writers: list[int]) -> None:
    _, pid = _writer(host, writers)
    os.kill(pid, signal.SIGSTOP)
    try:
        assert _wait_for(lambda: _state(pid) == "T")
        assert _export(host, hold="0").status_code == 200
        assert _thaw(host).status_code == 200
        assert _state(pid) == "T"  # not continued: it was not the freezer that stopped it
    finally:
        os.kill(pid, signal.SIGCONT)


def _refused(call: Callable[[], object]) -> str:
    with pytest.raises(SandboxException) as caught:
        call()
    assert HELD_MESSAGE in str(caught.value), caught.value
    return str(caught.value)


def test_while_held_the_api_refuses_writes_and_serves_reads(host: Rig) -> None:
    """Held for a pause, nothing the SDK writes through the daemon lands (it would be lost
        with the pod, or run unfrozen): an upload (plain HTTP, 409), a folder made, a file moved and
        removed (Connect, ``failed_precondition``), a process started, stdin and a signal to a running
    one. Reads still work; after the
        thaw the same writes do."""
    home = host.kept / "home/user" / f"held-{uuid.uuid4().hex[:8]}"
    home.mkdir()
    kept = home / "kept.txt"
    kept.write_text("before")
    upload, folder, moved, touched = (home / n for n in ("up.txt", "dir", "moved", "touched"))
    sbx = host.sbx
    running = sbx.commands.run("cat", background=True, timeout=0, stdin=True)
    assert _export(host, hold="60").status_code == 200
    try:
        assert "409" in _refused(lambda: sbx.files.write(str(upload), "lost"))
        assert "FAILED_PRECONDITION" in _refused(lambda: sbx.files.make_dir(str(folder)))
        _refused(lambda: sbx.files.rename(str(kept), str(moved)))
        _refused(lambda: sbx.files.remove(str(kept)))
        _refused(lambda: sbx.commands.run(f"touch {touched}"))
        _refused(lambda: sbx.commands.send_stdin(running.pid, "lost\n"))
        _refused(lambda: sbx.commands.kill(running.pid))
        assert sorted(p.name for p in home.iterdir()) == ["kept.txt"]
        assert kept.read_text() == "before"

        assert sbx.files.read(str(kept)) == "before"
        assert [e.name for e in sbx.files.list(str(home))] == ["kept.txt"]
        assert sbx.files.exists(str(kept))
        assert running.pid in [p.pid for p in sbx.commands.list()]  # not killed
        url = host.daemon.url
        assert httpx.get(f"{url}/health", timeout=10).status_code == 204
        assert httpx.get(f"{url}/metrics", headers=AUTH, timeout=10).status_code == 200
        assert _export(host, hold="0").status_code == 200  # a second export: still a read
    finally:
        assert _thaw(host).status_code == 200
    sbx.files.write(str(upload), "kept")
    sbx.files.make_dir(str(folder))
    sbx.files.rename(str(kept), str(moved))
    assert sbx.commands.run(f"touch {touched}").exit_code == 0
    assert upload.read_text() == "kept" and folder.is_dir() and moved.read_text() == "before"
    assert touched.exists() and not kept.exists()
    sbx.files.remove(str(moved))
    assert not moved.exists()
    assert sbx.commands.kill(running.pid)


def test_an_export_with_a_hold_waits_for_an_upload_in_flight(host: Rig) -> None:
    """An upload admitted before the hold and still streaming in: the export waits for it, so
    the tar holds the whole file (answered 200 to its client) rather than half of it, the rest
    lost with the pod. Meanwhile the hold already refuses new writes."""
    target = host.kept / "home/user" / f"upload-{uuid.uuid4().hex[:8]}.bin"
    chunks = [bytes([i]) * 65536 for i in range(8)]
    go = threading.Event()
    answers: dict[str, httpx.Response] = {}

    def body() -> Iterator[bytes]:
        yield chunks[0]
        go.wait(WAIT)  # the rest only once the export is waiting
        yield from chunks[1:]

    def upload() -> None:
        answers["upload"] = httpx.post(
            f"{host.daemon.url}/files",
            params={"path": str(target)},
            content=body(),
            headers={**AUTH, "content-type": "application/octet-stream"},
            timeout=60,
        )

    def export() -> None:
        answers["export"] = _export(host, hold="60")

    uploading = threading.Thread(target=upload)
    uploading.start()
    exporting = threading.Thread(target=export)
    try:
        assert _wait_for(lambda: target.exists() and target.stat().st_size >= 65536)
        exporting.start()
        init = f"{host.daemon.url}/init"
        held = lambda: httpx.post(init, json={}, headers=AUTH, timeout=10).status_code == 409  # noqa: E731
        assert _wait_for(held), "the export did not begin holding"
    finally:
        go.set()
        uploading.join(60)
        if exporting.ident is not None:  # started
            exporting.join(60)
        assert _thaw(host).status_code == 200
    assert answers["upload"].status_code == 200, answers["upload"].text
    assert answers["export"].status_code == 200, answers["export"].text
    assert _member(answers["export"].content, target, host.kept) == b"".join(chunks)


def _end_of_stream(answer: httpx.Response) -> dict[str, object]:
    """The error of a Connect stream's answer: its one frame, an end-of-stream (flag 2)."""
    flags, size = struct.unpack(">BI", answer.content[:5])
    assert flags == 2 and len(answer.content) == 5 + size, answer.content
    error: dict[str, object] = json.loads(answer.content[5:])["error"]
    return error


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/files/"),
        ("POST", "/FILES"),
        ("POST", "//files"),
        ("PUT", "/files"),
        ("DELETE", "/files"),
        ("POST", "/files%2F"),
        ("POST", "/init"),
        ("POST", "/kept-files"),
        ("POST", "/filesystem.Filesystem/MakeDir"),
        ("GET", "/filesystem.Filesystem/MakeDir"),
        ("POST", "/filesystem.Filesystem/makedir"),
        ("POST", "/filesystem.Filesystem/MakeDir/"),
        ("POST", "/filesystem.Filesystem//MakeDir"),
        ("POST", "//filesystem.Filesystem/MakeDir"),
        ("POST", "/Filesystem.Filesystem/MakeDir"),
        ("POST", "/filesystem.Filesystem/MakeDir%00"),
        ("POST", "/process.Process/Start"),
        ("POST", "/process.Process/start"),
        ("POST", "/process.Process/Start/"),
    ],
)
def test_a_write_spelled_otherwise_is_never_performed_while_held(
    host: Rig, method: str, path: str
) -> None:
    """Hostile spellings of a write during a hold: refused (409, or Connect's
    ``failed_precondition``) or no route at all (404, 405), and nothing appears on disk."""
    target = host.kept / "home/user" / f"sneak-{uuid.uuid4().hex[:8]}"
    bodies = {
        "/files": b"--boundary--",
        "Filesystem": json.dumps({"path": str(target)}).encode(),
        "Process": json.dumps({"process": {"cmd": "/bin/touch", "args": [str(target)]}}).encode(),
    }
    body = next((v for k, v in bodies.items() if k.lower() in path.lower()), b"{}")
    content_type = "application/json"
    if path.lower().startswith("/process.process/start"):  # a server stream: enveloped
        body, content_type = struct.pack(">BI", 0, len(body)) + body, "application/connect+json"
    assert _export(host, hold="60").status_code == 200
    try:
        answer = httpx.request(
            method,
            f"{host.daemon.url}{path}",
            params={"path": str(target)},
            content=body,
            headers={**AUTH, "content-type": content_type},
            timeout=30,
        )
        if answer.status_code not in (404, 405):  # no such route or method: nothing ran
            error = answer.json() if answer.status_code != 200 else _end_of_stream(answer)
            assert answer.status_code in (200, 400, 409), (answer.status_code, answer.text)
            assert error["code"] in (409, "failed_precondition"), answer.text
            assert error["message"] == HELD_MESSAGE
        assert not target.exists()
    finally:
        assert _thaw(host).status_code == 200
    assert not target.exists()


@pytest.mark.parametrize(
    "query",
    [
        {"hold": "-1"},
        {"hold": "1.5"},
        {"hold": "601"},
        {"hold": "99999999999999999999"},
        {"hold": "--ro-bind"},
        {"hold": "1\x00"},
        {"hold": ""},
        {"hold": "\u0661"},  # ARABIC-INDIC DIGIT ONE: a digit to str.isdigit, not to us
        {"limit": "5"},
    ],
)
def test_a_bad_hold_is_refused_and_freezes_nothing(host: Rig, query: dict[str, str]) -> None:
    answer = _export(host, **query)
    assert answer.status_code == 400, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert "hold" in answer.json()["message"]
    assert _thaw(host).json() == {"continued": 0}


def test_thaw_needs_the_token(host: Rig) -> None:
    url = f"{host.daemon.url}/kept-files/thaw"
    assert httpx.post(url, timeout=10).status_code == 401
    assert httpx.post(url, headers={"X-Access-Token": "--ro-bind"}, timeout=10).status_code == 401
    assert httpx.get(url, headers=AUTH, timeout=10).status_code == 405
    refused = httpx.post(url, params={"hold": "600"}, headers=AUTH, timeout=10)
    assert refused.status_code == 400 and "no parameters" in refused.json()["message"]


def test_a_stopping_daemon_kills_what_it_holds(
    tmp_path: Path, control_plane: str, writers: list[int]
) -> None:
    """The pod stops with its processes held: the daemon going away kills them, even one in a
    session of its own (outside every process group the daemon started), never continues them."""
    made = _rig(tmp_path, control_plane, pid_namespace=False)
    rig = next(made)
    try:
        marker = f"600.{uuid.uuid4().int % 10**12:012d}"  # a unique interval for sleep
        rig.sbx.commands.run(f"setsid -w sleep {marker}", background=True, timeout=0)
        sleeping = lambda: [p for p in _host_pids(marker) if _comm(p) == "sleep"]  # noqa: E731
        assert _wait_for(lambda: bool(sleeping())), "setsid -w sleep did not start"
        (pid,) = sleeping()  # in a session of its own
        writers.append(pid)
        assert os.getsid(pid) == pid
        assert _export(rig, hold="60").status_code == 200
        assert _held(pid)
        stop_daemon(rig.daemon)
        assert _wait_for(lambda: _state(pid) in ("gone", "Z")), "a held process outlived the daemon"
    finally:
        made.close()


def test_a_daemon_that_sees_another_namespaces_proc_refuses(tmp_path: Path) -> None:
    """In a PID namespace of its own but with the host's ``/proc`` (a pod set up wrong), pids
    in ``/proc`` are not the ones its signals reach: it refuses the export (500, the reason),
    stopping nothing, rather than guess."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        skip_or_fail("bubblewrap (bwrap) is missing: apt-get install -y bubblewrap")
    assert bwrap is not None
    kept = tmp_path / "kept"
    for top in ("home/user", "workspace"):
        (kept / top).mkdir(parents=True)
    prefix = (bwrap, "--unshare-pid", "--die-with-parent", "--dev-bind", "/", "/", "--")
    daemon = start_daemon(
        tmp_path, tmp_path / "envd.log", extra=("--kept-root", str(kept)), prefix=prefix
    )
    try:
        answer = httpx.get(
            f"{daemon.url}/kept-files", params={"hold": "5"}, headers=AUTH, timeout=30
        )
        assert answer.status_code == 500, answer.text
        assert answer.headers["content-type"] == "application/json"
        assert "not its own PID namespace" in answer.json()["message"]
        assert _state(os.getpid()) in ("S", "R")
    finally:
        stop_daemon(daemon)


FORKING = """
import subprocess, time
from services.envd.freezing import Freezer, FreezeFailed, read_stat
kids = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
time.sleep(0.2)
try:
    Freezer(max_passes=1).freeze()
    print("frozen")
except FreezeFailed as e:
    print("refused:", e)
print(" ".join(read_stat(k.pid).state for k in kids))
for k in kids:
    k.kill()
"""


def test_a_freeze_that_does_not_settle_continues_everything() -> None:
    """Passes are bounded: one that still stops something new at the last pass refuses, and
    every process it stopped runs again (a separate process: the freezer stops its own
    descendants on the host)."""
    done = subprocess.run(
        [sys.executable, "-c", FORKING],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    refused, states = done.stdout.splitlines()
    assert refused.startswith("refused: ") and "1 passes" in refused, done.stdout + done.stderr
    assert set(states.split()) <= {"S", "R"}, states
