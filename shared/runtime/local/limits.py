"""Resource limits of a pod (``resources.limits`` of the template).

- on a host with a writable cgroup v2 hierarchy that delegates memory, cpu and pids: one cgroup
  per pod enforces ``memory`` (no swap), ``cpu`` (quota) and ``pids`` for the whole pod;
- otherwise (cgroup v1, containers without delegation): ``prlimit`` sets RLIMIT_AS to ``memory``
  per process (address space, not resident memory) and RLIMIT_NOFILE to ``nofile``; ``cpu`` and
  ``pids`` are NOT enforced (RLIMIT_NPROC does not bind root). There are no disk quotas:
  ``/workspace`` and volumes live on the host's data dir filesystem.
"""

from __future__ import annotations

import contextlib
import resource
import shutil
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger()


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
