"""Finding, spawning and stopping pod processes through ``/proc``.

A pod's bwraps carry ``TORPOR_*`` marks on their command line, which sandbox code can imitate;
so a process counts only where no sandbox process can be: an outer bwrap in the runtime's own
PID namespace, or an inner one as PID 1 of a namespace directly below it. A pod is stopped by
SIGTERM to its processes and, after a grace period, SIGKILL to both bwraps: when PID 1 of a
namespace dies the kernel kills every process in it (the launcher then also empties the pod's
cgroups).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from shared.runtime.local.bwrap import ENV_POD_UID, ENV_RUNTIME, ENV_WORKLOAD, runtime_id

log = structlog.get_logger()


# The pod's PID 1 keeps the environment bwrap was started with (``/proc/1/environ`` inside):
# never the runtime's own, which may hold credentials.
SPAWN_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


async def spawn(
    argv: Sequence[str], output: int, *, pass_fds: Sequence[int] = ()
) -> asyncio.subprocess.Process:
    """Start a pod: ``output`` (the pipe of its log reader, :mod:`.podlog`) is its stdout and
    stderr; it gets no other descriptor of the runtime's but ``pass_fds``."""
    return await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=output,
        stderr=output,
        pass_fds=tuple(pass_fds),
        env=SPAWN_ENV,
        start_new_session=True,  # survives the owner; no terminal signals from it
    )


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a process, or ``None`` when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return fields[0], int(fields[1])


def _setenv_values(argv: list[str]) -> dict[str, str]:
    # Right after spawn the pod may still be its limit wrapper (``prlimit ... -- bwrap ...``):
    # read from bwrap on, or the wrapper's ``--`` would make a starting pod look dead.
    start = next((i for i, a in enumerate(argv) if os.path.basename(a) == "bwrap"), 0)
    values = {}
    for i, arg in enumerate(argv[:-2]):
        if i < start:
            continue
        if arg == "--setenv" and argv[i + 1].startswith("TORPOR_"):
            values[argv[i + 1]] = argv[i + 2]
        if arg == "--":
            break
    return values


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot): with the pid, its identity."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rfind(")") + 2 :].split()[19])


def is_pod_alive(pid: int, uid: str, started: int | None = None) -> bool:
    """True while the outer bwrap of pod ``uid`` runs (pid reuse and zombies count as dead).

    With ``started`` (recorded at spawn) the process is recognised by pid and start time alone:
    reading a busy process's command line can fail, and a live pod taken for dead would be
    forgotten while it keeps running."""
    stat = _stat(pid)
    if stat is None or stat[0] in {"Z", "X"}:
        return False
    if started is not None:
        return start_ticks(pid) == started
    return _setenv_values(_cmdline(pid)).get(ENV_POD_UID) == uid


def valid_pod_uid(uid: str) -> bool:
    """Pod uids are the runtime's own uuid4 strings; anything else is not one of our pods."""
    try:
        return str(uuid.UUID(uid)) == uid
    except ValueError:
        return False


def _nspids(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            return line.split()[1:]
    return None


@dataclass(frozen=True)
class FoundPod:
    pid: int  # the outer bwrap, or the inner one when the outer was killed on its own
    uid: str
    workload: str


@dataclass(frozen=True)
class _PodProcess:
    pid: int
    uid: str
    workload: str
    outer: bool


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _pod_processes(runtime_root: Path) -> list[_PodProcess]:
    """Every live bwrap (outer and inner) of pods started with this data dir."""
    own_ns = os.readlink("/proc/self/ns/pid")
    mark = runtime_id(runtime_root)
    found = []
    for pid in _pids():
        argv = _cmdline(pid)
        if not argv or os.path.basename(argv[0]) != "bwrap":
            continue
        marks = _setenv_values(argv)
        if marks.get(ENV_RUNTIME) != mark or ENV_POD_UID not in marks:
            continue
        stat = _stat(pid)
        if stat is None or stat[0] in {"Z", "X"}:
            continue
        if not valid_pod_uid(marks[ENV_POD_UID]):
            continue
        try:
            outer = os.readlink(f"/proc/{pid}/ns/pid") == own_ns  # the inner one is PID 1 inside
        except OSError:
            continue
        # Sandbox code can fake a bwrap command line with our marks, but not its place: a real
        # outer bwrap lives in our PID namespace (sandbox processes never do), a real inner one
        # is PID 1 of a namespace directly below ours (sandbox processes are never PID 1 there).
        if not outer and _nspids(pid) != [str(pid), "1"]:
            continue
        found.append(_PodProcess(pid, marks[ENV_POD_UID], marks.get(ENV_WORKLOAD, ""), outer))
    return found


def scan_pods(runtime_root: Path) -> list[FoundPod]:
    """The pods started by a runtime with this data dir (by any owner), one entry per pod."""
    by_uid: dict[str, _PodProcess] = {}
    for proc in _pod_processes(runtime_root):
        if proc.uid not in by_uid or proc.outer:
            by_uid[proc.uid] = proc
    return [FoundPod(pid=p.pid, uid=p.uid, workload=p.workload) for p in by_uid.values()]


def inner_pid(outer: int) -> int | None:
    """The pod's PID 1 (the inner bwrap, in the pod's namespaces) under outer bwrap ``outer``."""
    try:  # its direct child, as a rule: no walk over every process
        children = Path(f"/proc/{outer}/task/{outer}/children").read_text().split()
    except OSError:
        children = []
    for pid in [*map(int, children), *descendants(outer)]:
        if (_nspids(pid) or [""])[-1] == "1":
            return pid
    return None


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for p in _pids():
        stat = _stat(p)
        if stat is not None:
            children.setdefault(stat[1], []).append(p)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


async def stop_pod(uid: str, *, runtime_root: Path, grace: float) -> None:
    """SIGTERM every process of pod ``uid``, then after ``grace`` SIGKILL its bwraps (which makes
    the kernel kill the whole PID namespace). Returns once the pod is gone."""
    procs = [p for p in await asyncio.to_thread(_pod_processes, runtime_root) if p.uid == uid]
    if not procs:
        return
    bwraps = {p.pid for p in procs}
    for proc in procs:
        for child in await asyncio.to_thread(descendants, proc.pid):
            if child not in bwraps:
                _signal(child, signal.SIGTERM)
    if await _wait_gone(procs, grace):
        return
    for proc in sorted(procs, key=lambda p: p.outer):  # inner (PID 1 inside) first
        _signal(proc.pid, signal.SIGKILL)
    if not await _wait_gone(procs, 10.0):
        log.error("runtime_local_pod_unkillable", pod_uid=uid, pids=sorted(bwraps))


async def _wait_gone(procs: list[_PodProcess], within: float) -> bool:
    deadline = time.monotonic() + within
    delay = 0.01
    while any(is_pod_alive(p.pid, p.uid) for p in procs):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.1)
    return True


async def stop_all(runtime_root: Path, *, grace: float) -> int:
    """Stop every pod started with this data dir (the supervisor's shutdown sweep); records keep
    their replicas, so the next start brings the sandboxes back. Returns how many were stopped."""
    found = scan_pods(runtime_root)
    await asyncio.gather(
        *(stop_pod(pod.uid, runtime_root=runtime_root, grace=grace) for pod in found)
    )
    return len(found)
