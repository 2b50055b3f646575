"""Pod processes of the local runtime: bubblewrap command lines, spawning, finding and stopping.

A pod is an outer ``bwrap`` process (in its own session, so it outlives the runtime that started
it) whose child, the inner ``bwrap``, is PID 1 of a fresh PID namespace running the in-sandbox
daemon. There is deliberately no ``--die-with-parent`` (it would kill pods with their owner,
while a restarted owner must find them running). A pod is stopped by SIGTERM to its processes
and, after a grace period, SIGKILL to both bwraps: when PID 1 of a namespace dies the kernel kills
every process in it, so nothing survives. Pods are recognised in ``/proc`` by the ``TORPOR_*``
variables on the bwrap command line (both bwraps carry them).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import resource
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from shared.errors import ConfigError

log = structlog.get_logger()

ENV_POD_UID = "TORPOR_POD_UID"
ENV_WORKLOAD = "TORPOR_WORKLOAD"
ENV_RUNTIME_ROOT = "TORPOR_RUNTIME_ROOT"
INSTALL_HINT = "install it with `apt-get install -y bubblewrap`"
# Host directories every pod sees read-only: the OS, plus the interpreter and code of the daemon.
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")


async def check_bwrap(bwrap: str) -> None:
    """Fail with one clear line when bubblewrap is missing or cannot create a PID namespace."""
    try:
        proc = await asyncio.create_subprocess_exec(
            bwrap,
            "--unshare-pid",
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--",
            "true",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as e:
        msg = f"bubblewrap ({bwrap}) is not available ({e.strerror}): {INSTALL_HINT}"
        raise ConfigError(msg) from e
    _, err = await proc.communicate()
    if proc.returncode != 0:
        reason = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        msg = (
            f"bubblewrap ({bwrap}) cannot create namespaces here ({reason[0]}): {INSTALL_HINT} "
            "and allow user namespaces (sysctl kernel.unprivileged_userns_clone=1)"
        )
        raise ConfigError(msg)


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class PodLaunch:
    """Everything needed to build one pod's command line."""

    bwrap: str
    uid: str
    workload: str
    runtime_root: Path  # the runtime's data dir: marks the pod as ours, masked inside the pod
    workspace: Path
    workdir: str
    mounts: Sequence[Mount]
    env: dict[str, str]
    command: Sequence[str]
    code_dirs: Sequence[Path]  # interpreter + venv + repo, bound read-only
    hostname: str


def bwrap_argv(launch: PodLaunch, *, env_fd: int | None = None) -> list[str]:
    """The pod's bwrap command line. With ``env_fd``, the pod's environment (access token, user
    envs) is read by bwrap from that descriptor (``--args``, see :func:`env_args`) instead of
    the command line, which every local user can read in ``ps``; only the ``TORPOR_*`` marks
    that identify the pod stay in argv."""
    argv = [
        launch.bwrap,
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--hostname",
        launch.hostname,
        "--new-session",
        "--clearenv",
        # bwrap run by root keeps every capability; sandbox code gets none.
        "--cap-drop",
        "ALL",
        # A fresh root: only what is listed below exists, so pods cannot read each other's
        # workspaces or torpor's data dir through the host filesystem.
        "--tmpfs",
        "/",
    ]
    for folder in _SYSTEM_DIRS:
        if os.path.islink(folder):
            argv += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            argv += ["--ro-bind", folder, folder]
    argv += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",  # noqa: S108 - the pod's own /tmp, a fresh tmpfs
        "--tmpfs",
        "/run",
    ]
    # After the /tmp and /run tmpfs: a checkout or venv that lives under /tmp must stay visible.
    for code_dir in launch.code_dirs:
        argv += ["--ro-bind", str(code_dir), str(code_dir)]
    for folder in [*_SYSTEM_DIRS, *map(str, launch.code_dirs)]:
        # Hide the data dir if one of the read-only binds contains it.
        if _is_within(launch.runtime_root, Path(folder)):
            argv += ["--tmpfs", str(launch.runtime_root)]
            break
    argv += ["--bind", str(launch.workspace), "/workspace"]
    for mount in launch.mounts:
        argv += ["--ro-bind" if mount.read_only else "--bind", str(mount.source), mount.target]
    argv += ["--chdir", launch.workdir]
    marks = {
        ENV_POD_UID: launch.uid,
        ENV_WORKLOAD: launch.workload,
        ENV_RUNTIME_ROOT: str(launch.runtime_root),
    }
    if env_fd is None:
        for key, value in launch.env.items():
            argv += ["--setenv", key, value]
    else:
        argv += ["--args", str(env_fd)]
    for key, value in marks.items():
        argv += ["--setenv", key, value]
    return [*argv, "--", *launch.command]


def env_args(env: Mapping[str, str]) -> bytes:
    """``--setenv`` options for bwrap's ``--args FD``: NUL-separated, never on a command line."""
    parts = []
    for key, value in env.items():
        parts += ["--setenv", key, value]
    return b"".join(p.encode() + b"\0" for p in parts)


def _is_within(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(Path(folder).resolve())
    except ValueError:
        return False
    return True


def code_dirs() -> list[Path]:
    """What ``python -m services.envd`` needs, read-only: the interpreter, the venv and the
    daemon's own package (not the rest of torpor's source tree)."""
    spec = importlib.util.find_spec("services.envd")
    if spec is None or spec.origin is None:
        msg = "the in-sandbox daemon (services.envd) is not installed"
        raise ConfigError(msg)
    envd = Path(spec.origin).resolve().parent
    paths = {
        Path(sys.base_prefix).resolve(),
        Path(sys.prefix).resolve(),
        envd,
        envd.parent / "__init__.py",
    }
    system = [Path(d).resolve() for d in _SYSTEM_DIRS if os.path.isdir(d)]
    # Drop paths already visible through a system bind or another code path.
    kept = [
        p
        for p in paths
        if not any(_is_within(p, s) for s in system)
        and not any(p != o and _is_within(p, o) for o in paths)
    ]
    return sorted(kept)


# ---- bytecode ---------------------------------------------------------------------------

_BYTECODE_SENTINELS = ("uvicorn", "connectrpc", "protobuf")  # big third-party imports


def _pyc(source: Path) -> Path:
    return source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc"


def daemon_bytecode_stale() -> bool:
    """True when the daemon's bytecode is missing or older than its sources and can be written.

    Pods see the code read-only, so a daemon whose bytecode is stale compiles its imports on
    every start (a few hundred ms). Cheap: the daemon's own files (what developers edit) and the
    package roots of its big dependencies (written by ``scripts/setup.sh``)."""
    spec = importlib.util.find_spec("services.envd")
    if spec is None or spec.origin is None:
        return False
    envd = Path(spec.origin).parent
    if not os.access(envd, os.W_OK):
        return False  # an installed read-only tree: nothing we could fix
    sources = list(envd.rglob("*.py"))
    for name in _BYTECODE_SENTINELS:
        dep = importlib.util.find_spec(name)
        if dep is not None and dep.origin is not None:
            sources.append(Path(dep.origin))
    for source in sources:
        try:
            if _pyc(source).stat().st_mtime < source.stat().st_mtime:
                return True
        except FileNotFoundError:
            return True
        except OSError:
            continue
    return False


async def precompile_daemon(python: str) -> None:
    """``python -m services.envd --precompile`` where the tree is writable (a developer's
    checkout, CI); a failure only costs start-up time, so it is logged, not raised."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX"}
    }
    try:
        proc = await asyncio.create_subprocess_exec(
            python,
            "-m",
            "services.envd",
            "--precompile",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
        )
        out, _ = await proc.communicate()
    except OSError as e:
        log.warning("runtime.local.precompile_failed", error=str(e))
        return
    if proc.returncode != 0:
        log.warning("runtime.local.precompile_failed", output=out.decode(errors="replace")[-300:])
    else:
        log.info("runtime.local.precompiled", output=out.decode(errors="replace").strip())


# ---- resource limits ------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    memory_bytes: int | None
    cpu_millis: int | None
    pids: int | None
    nofile: int | None


CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_parent() -> Path | None:
    """``/sys/fs/cgroup/torpor`` with memory, cpu and pids delegated, or ``None`` when the
    host has no writable cgroup v2 hierarchy with those controllers (e.g. cgroup v1)."""
    parent = CGROUP_ROOT / "torpor"
    try:
        controllers = (CGROUP_ROOT / "cgroup.controllers").read_text().split()
        if not {"memory", "cpu", "pids"} <= set(controllers):
            return None
        parent.mkdir(exist_ok=True)
        (CGROUP_ROOT / "cgroup.subtree_control").write_text("+memory +cpu +pids")
        (parent / "cgroup.subtree_control").write_text("+memory +cpu +pids")
    except OSError:
        return None
    return parent


def make_cgroup(parent: Path, uid: str, limits: Limits) -> Path | None:
    group = parent / uid
    try:
        group.mkdir()
        if limits.memory_bytes is not None:
            (group / "memory.max").write_text(str(limits.memory_bytes))
            (group / "memory.swap.max").write_text("0")
        if limits.cpu_millis is not None:
            (group / "cpu.max").write_text(f"{limits.cpu_millis * 100} 100000")
        if limits.pids is not None:
            (group / "pids.max").write_text(str(limits.pids))
    except OSError as e:
        log.warning("runtime.local.cgroup_failed", cgroup=str(group), error=str(e))
        remove_cgroup(group)
        return None
    return group


def remove_cgroup(group: Path | None) -> None:
    if group is not None:
        with contextlib.suppress(OSError):
            group.rmdir()


def capped_rlimit(which: int, wanted: int) -> int:
    """``wanted``, lowered to our own hard limit (raising it needs CAP_SYS_RESOURCE)."""
    _, hard = resource.getrlimit(which)
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def limit_wrapper(limits: Limits, cgroup: Path | None) -> list[str]:
    """Argv prefix that applies limits to the pod before bwrap starts (so no child escapes).

    With a cgroup: join it (memory, cpu and pids are enforced for the whole pod). Without one:
    ``prlimit`` per-process limits (address space for memory, open files); cpu and pids are not
    enforced (RLIMIT_NPROC does not bind root).
    """
    prefix: list[str] = []
    if cgroup is not None:
        prefix += ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup)]
    prlimit = shutil.which("prlimit")
    rlimits = []
    if limits.nofile is not None:
        nofile = capped_rlimit(resource.RLIMIT_NOFILE, limits.nofile)
        rlimits.append(f"--nofile={nofile}:{nofile}")
    if cgroup is None and limits.memory_bytes is not None:
        memory = capped_rlimit(resource.RLIMIT_AS, limits.memory_bytes)
        rlimits.append(f"--as={memory}:{memory}")
    if prlimit and rlimits:
        prefix += [prlimit, *rlimits, "--"]
    return prefix


# ---- process table --------------------------------------------------------------------


def open_env_file(path: Path, env: Mapping[str, str]) -> int:
    """The pod's environment for ``bwrap --args`` in an unlinked 0600 file (no size limit, unlike
    a pipe written before the reader starts): a descriptor at its start, to be passed to the pod.
    Nothing stays on disk."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.unlink(path)
        data = env_args(env)
        while data:
            data = data[os.write(fd, data) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd


async def spawn(
    argv: Sequence[str], log_path: Path, *, pass_fds: Sequence[int] = ()
) -> asyncio.subprocess.Process:
    with log_path.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            pass_fds=tuple(pass_fds),
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


def is_pod_alive(pid: int, uid: str) -> bool:
    """True while the outer bwrap of pod ``uid`` runs (pid reuse and zombies count as dead)."""
    stat = _stat(pid)
    if stat is None or stat[0] in {"Z", "X"}:
        return False
    return _setenv_values(_cmdline(pid)).get(ENV_POD_UID) == uid


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
    root = str(runtime_root)
    found = []
    for pid in _pids():
        argv = _cmdline(pid)
        if not argv or os.path.basename(argv[0]) != "bwrap":
            continue
        marks = _setenv_values(argv)
        if marks.get(ENV_RUNTIME_ROOT) != root or ENV_POD_UID not in marks:
            continue
        stat = _stat(pid)
        if stat is None or stat[0] in {"Z", "X"}:
            continue
        try:
            outer = os.readlink(f"/proc/{pid}/ns/pid") == own_ns  # the inner one is PID 1 inside
        except OSError:
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
        log.error("runtime.local.pod_unkillable", pod_uid=uid, pids=sorted(bwraps))


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
