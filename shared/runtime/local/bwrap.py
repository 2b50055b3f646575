"""The pod's bubblewrap command line, and the check that bubblewrap works on this host.

A pod is an outer ``bwrap`` process (in its own session, so it outlives the runtime that started
it) whose child, the inner ``bwrap``, is PID 1 of a fresh PID namespace running the in-sandbox
daemon. There is deliberately no ``--die-with-parent`` (it would kill pods with their owner,
while a restarted owner must find them running). Pods are recognised in ``/proc`` by the
``TORPOR_*`` variables on the bwrap command line (see :mod:`.procfs`).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from shared.errors import ConfigError

ENV_POD_UID = "TORPOR_POD_UID"
ENV_WORKLOAD = "TORPOR_WORKLOAD"
ENV_RUNTIME_ROOT = "TORPOR_RUNTIME_ROOT"
INSTALL_HINT = "install it with `apt-get install -y bubblewrap`"
# Host directories every pod sees read-only: the OS, plus the interpreter and code of the daemon.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")


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
    pycache: Path | None = None  # the daemon's bytecode cache, bound read-only (see .bytecode)


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
    for folder in SYSTEM_DIRS:
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
    for folder in [*SYSTEM_DIRS, *map(str, launch.code_dirs)]:
        # Hide the data dir if one of the read-only binds contains it.
        if is_within(launch.runtime_root, Path(folder)):
            argv += ["--tmpfs", str(launch.runtime_root)]
            break
    if launch.pycache is not None:  # after the data dir's mask: the cache may live in it
        argv += ["--ro-bind", str(launch.pycache), str(launch.pycache)]
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


def is_within(path: Path, folder: Path) -> bool:
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
    system = [Path(d).resolve() for d in SYSTEM_DIRS if os.path.isdir(d)]
    # Drop paths already visible through a system bind or another code path.
    kept = [
        p
        for p in paths
        if not any(is_within(p, s) for s in system)
        and not any(p != o and is_within(p, o) for o in paths)
    ]
    return sorted(kept)


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
