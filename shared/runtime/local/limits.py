"""Resource limits of a pod (``resources.limits`` of the template): one cgroup per pod.

cgroup v2 (a writable ``/sys/fs/cgroup`` delegating memory, cpu and pids): the pod's cgroup is
``/sys/fs/cgroup/torpor-<instance>/<pod uid>`` with ``memory.max`` (and no swap), ``cpu.max`` and
``pids.max``. cgroup v1 (``/sys/fs/cgroup/<controller>``): one cgroup per controller under the
runtime's own cgroup of that controller, ``.../torpor-<instance>/<pod uid>``, with
``memory.limit_in_bytes`` (and ``memsw`` to the same: no swap), ``cpu.cfs_quota_us`` and
``pids.max``. ``<instance>`` is derived from the data dir, so two runtimes on one host never
share a cgroup. The pod joins its cgroups before any sandbox code runs (see :mod:`.launcher`),
so everything it starts is counted; the cgroup is also the authoritative list of the pod's
processes when it is stopped, and is removed with the pod.

Without a writable cgroup hierarchy (a container without delegation) only rlimits apply:
RLIMIT_AS per process for ``memory`` and RLIMIT_NOFILE; cpu and pids are then NOT enforced.
``nofile`` is always an rlimit. Disk (``disk``) is enforced by :mod:`.disk`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import resource
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger()

CGROUP_ROOT = Path("/sys/fs/cgroup")
_V1_CONTROLLERS = ("memory", "cpu", "pids")
_CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Limits:
    memory_bytes: int | None
    cpu_millis: int | None
    pids: int | None
    nofile: int | None
    disk_bytes: int | None = None


def instance_name(data_dir: Path) -> str:
    return "torpor-" + hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]


class Cgroups:
    """The per-pod cgroups of one runtime instance."""

    def __init__(self, parents: dict[str, Path], *, v2: bool) -> None:
        self.parents = parents  # controller ("" for v2) -> the instance's folder
        self.v2 = v2

    @classmethod
    def detect(cls, instance: str) -> Cgroups | None:
        """The instance's cgroup folders (created), or ``None`` without a usable hierarchy."""
        try:
            return _detect_v2(instance) or _detect_v1(instance)
        except OSError as e:
            log.warning("runtime_local_cgroups_unavailable", error=str(e))
            return None

    def folders(self, uid: str) -> list[Path]:
        return [parent / uid for parent in self.parents.values()]

    def create(self, uid: str, limits: Limits) -> None:
        """Create the pod's cgroups with its limits (``OSError`` when the kernel refuses)."""
        try:
            for folder in self.folders(uid):
                # The instance folder again: another runtime of the data dir may have removed it.
                folder.parent.mkdir(exist_ok=True)
                folder.mkdir()
            if self.v2:
                self._limits_v2(self.parents[""] / uid, limits)
            else:
                self._limits_v1(uid, limits)
        except OSError:
            self.remove(uid)
            raise

    def _limits_v2(self, group: Path, limits: Limits) -> None:
        if limits.memory_bytes is not None:
            (group / "memory.max").write_text(str(limits.memory_bytes))
            with contextlib.suppress(FileNotFoundError):  # no swap accounting: nothing to cap
                (group / "memory.swap.max").write_text("0")
        if limits.cpu_millis is not None:
            quota = limits.cpu_millis * _CPU_PERIOD_US // 1000
            (group / "cpu.max").write_text(f"{quota} {_CPU_PERIOD_US}")
        if limits.pids is not None:
            (group / "pids.max").write_text(str(limits.pids))

    def _limits_v1(self, uid: str, limits: Limits) -> None:
        if limits.memory_bytes is not None:
            memory = self.parents["memory"] / uid
            (memory / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
            with contextlib.suppress(FileNotFoundError):  # memory+swap: the same, so no swap
                (memory / "memory.memsw.limit_in_bytes").write_text(str(limits.memory_bytes))
        if limits.cpu_millis is not None:
            cpu = self.parents["cpu"] / uid
            (cpu / "cpu.cfs_period_us").write_text(str(_CPU_PERIOD_US))
            (cpu / "cpu.cfs_quota_us").write_text(str(limits.cpu_millis * _CPU_PERIOD_US // 1000))
        if limits.pids is not None:
            (self.parents["pids"] / uid / "pids.max").write_text(str(limits.pids))

    def join(self, uid: str, pids: list[int]) -> None:
        for folder in self.folders(uid):
            for pid in pids:
                (folder / "cgroup.procs").write_text(str(pid))

    def set_cpu_weight(self, uid: str, weight: int) -> None:
        """The pod's share of contended CPU (cgroup v2 ``cpu.weight``, 100 by default; v1
        ``cpu.shares``, scaled): warm pods wait at a low weight until claimed (see .pools)."""
        for controller, parent in self.parents.items():
            shares = weight * 1024 // 100
            name, value = ("cpu.weight", weight) if self.v2 else ("cpu.shares", shares)
            if self.v2 or "cpu" in controller.split(","):
                with contextlib.suppress(OSError):
                    (parent / uid / name).write_text(str(max(2, value)))

    def procs(self, uid: str) -> set[int]:
        """Every process of the pod (sandbox code cannot leave its cgroup)."""
        found: set[int] = set()
        for folder in self.folders(uid):
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (folder / "cgroup.procs").read_text().split())
        return found

    def kill(self, uid: str, *, within: float = 10.0) -> bool:
        """SIGKILL every process of the pod until none is left; False if some survived."""
        deadline = time.monotonic() + within
        while procs := self.procs(uid):
            if time.monotonic() >= deadline:
                return False
            for pid in procs:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        return True

    def remove(self, uid: str) -> None:
        for folder in self.folders(uid):
            with contextlib.suppress(OSError):
                folder.rmdir()

    def remove_instance(self) -> None:
        """Remove the instance's folders once no pod cgroup is left in them."""
        for parent in self.parents.values():
            with contextlib.suppress(OSError):
                parent.rmdir()

    def pod_uids(self) -> set[str]:
        """Pods that have a cgroup of this instance (only the runtime creates them)."""
        found: set[str] = set()
        for parent in self.parents.values():
            with contextlib.suppress(OSError):
                found.update(p.name for p in parent.iterdir() if p.is_dir())
        return found


def _detect_v2(instance: str) -> Cgroups | None:
    try:
        controllers = (CGROUP_ROOT / "cgroup.controllers").read_text().split()
    except OSError:
        return None
    if not {"memory", "cpu", "pids"} <= set(controllers):
        return None
    parent = CGROUP_ROOT / instance
    parent.mkdir(exist_ok=True)
    (CGROUP_ROOT / "cgroup.subtree_control").write_text("+memory +cpu +pids")
    (parent / "cgroup.subtree_control").write_text("+memory +cpu +pids")
    return Cgroups({"": parent}, v2=True)


def _detect_v1(instance: str) -> Cgroups | None:
    own = _own_v1_paths()
    parents = {}
    for controller in _V1_CONTROLLERS:
        mount = CGROUP_ROOT / controller
        if controller not in own or not (mount / "cgroup.procs").exists():
            return None
        parents[controller] = mount / own[controller].lstrip("/") / instance
    for parent in parents.values():
        parent.mkdir(exist_ok=True)
    return Cgroups(parents, v2=False)


def _own_v1_paths() -> dict[str, str]:
    """controller -> this process's cgroup path in that v1 hierarchy."""
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            if controller:
                paths[controller] = path
    return paths


def capped_rlimit(which: int, wanted: int) -> int:
    """``wanted``, lowered to our own hard limit (raising it needs CAP_SYS_RESOURCE)."""
    _, hard = resource.getrlimit(which)
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def rlimit_wrapper(limits: Limits, *, cgroups: bool) -> list[str]:
    """Argv prefix (``prlimit ... --``) that sets the pod's rlimits before bwrap starts: open
    files always, address space for ``memory`` only when no cgroup limits memory."""
    prlimit = shutil.which("prlimit")
    rlimits = []
    if limits.nofile is not None:
        nofile = capped_rlimit(resource.RLIMIT_NOFILE, limits.nofile)
        rlimits.append(f"--nofile={nofile}:{nofile}")
    if not cgroups and limits.memory_bytes is not None:
        memory = capped_rlimit(resource.RLIMIT_AS, limits.memory_bytes)
        rlimits.append(f"--as={memory}:{memory}")
    return [prlimit, *rlimits, "--"] if prlimit and rlimits else []
