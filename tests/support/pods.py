"""The host's view of an instance's processes, from /proc (no psutil): its bubblewrap pods, the
daemons inside them, its service processes. Services name the instance's data dir in their
environment; pods name it nowhere a sandbox could read (their mark is a digest of it), so they are
found the way the runtime finds them: :func:`shared.runtime.local.procfs.scan_pods`."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from shared.runtime.local import procfs


def cmdlines() -> list[tuple[int, list[bytes]]]:
    """(pid, argv) of every process we may read."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            found.append((int(entry.name), (entry / "cmdline").read_bytes().split(b"\0")))
        except OSError:
            continue
    return found


def _is_bwrap(argv: list[bytes]) -> bool:
    return bool(argv) and os.path.basename(argv[0]) == b"bwrap"


def pod_processes(data_dir: Path) -> list[int]:
    """Pids of this data dir's pods: each pod's bwrap (the runtime's own rule, which reads the
    mark and the place in the PID namespace tree) and every process under it."""
    pods = procfs.scan_pods(data_dir)
    return sorted({p for pod in pods for p in (pod.pid, *procfs.descendants(pod.pid))})


def kill_pods(data_dir: Path) -> None:
    """SIGKILL every pod of ``data_dir``: what a stopped instance must not leave running."""
    for pid in pod_processes(data_dir):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def bwrap_pod_uids(data_dir: Path) -> dict[str, int]:
    """Pod uid → pid of every bwrap pod of this data dir (the pods that really exist)."""
    return {pod.uid: pod.pid for pod in procfs.scan_pods(data_dir)}


def _is_daemon(argv: list[bytes]) -> bool:
    """``python -m services.envd …`` (the Kubernetes rig), or the local runtime's
    ``python -c "…run_module('services.envd', …)" …`` (pod_commands.bootstrap)."""
    return any(a == b"services.envd" or b"run_module('services.envd'" in a for a in argv)


def daemon_pid(host: str) -> int | None:
    """The in-sandbox daemon listening on ``host`` (inside bwrap, so not bwrap itself)."""
    listen = f"{host}:49983".encode()
    for pid, argv in cmdlines():
        if not _is_bwrap(argv) and _is_daemon(argv) and listen in argv:
            return pid
    return None


def daemon_pids(data_dir: Path) -> list[int]:
    """The daemons of this data dir's pods: processes under its bwraps (a daemon cannot outlive
    its bwrap, PID 1 of its namespace)."""
    under = {p for pid in bwrap_pod_uids(data_dir).values() for p in procfs.descendants(pid)}
    return [
        pid for pid, argv in cmdlines() if pid in under and not _is_bwrap(argv) and _is_daemon(argv)
    ]


def processes_mentioning(needle: str, *, zombies: bool = False) -> list[int]:
    """Pids (not ours) whose command line or environment contains ``needle``; ``zombies``:
    exited ones not yet reaped count too."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            blob = (entry / "cmdline").read_bytes() + b"\0" + (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if (zombies or state != "Z") and needle.encode() in blob:
            found.append(int(entry.name))
    return found


def instance_processes(data_dir: Path, *, zombies: bool = False) -> list[int]:
    """Every process of the instance with this data dir: those that name it (``torpor up``, its
    services, its pods' log readers) and its pods with everything in them."""
    return sorted({*processes_mentioning(str(data_dir), zombies=zombies), *pod_processes(data_dir)})


def service_pids(data_dir: Path, names: tuple[str, ...]) -> dict[str, int]:
    """Service name → pid of the processes ``... -m services.cli run <name>`` of one instance
    (``TORPOR_DATA_DIR=<data_dir>`` in their environment)."""
    found: dict[str, int] = {}
    for pid in processes_mentioning(f"TORPOR_DATA_DIR={data_dir}"):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"TORPOR_DATA_DIR={data_dir}".encode() not in environ:
            continue
        if b"run" in argv and argv.index(b"run") + 1 < len(argv):
            name = argv[argv.index(b"run") + 1].decode()
            if name in names:
                found.setdefault(name, pid)
    return found


async def release_pods(data_dir: Path) -> None:
    """Every pod of a local runtime's data dir stopped and its mounts undone: the safety net of
    tests that drive a ``LocalRuntime`` in-process (the tests assert on their own)."""
    from shared.runtime.local import disk, mounts

    for pod in procfs.scan_pods(data_dir):
        await procfs.stop_pod(pod.uid, runtime_root=data_dir, grace=0.5)
    for pod_dir in data_dir.glob("pods/*"):
        disk.unmount_workspace(pod_dir)
        mounts.unmount(pod_dir / "root")
        mounts.unmount(pod_dir / "lower")
    for layer in data_dir.glob("layers/*"):
        mounts.unmount(layer / "mnt")


async def warm_pods(nats_url: str) -> int:
    """Ready, unclaimed warm-pool pods of a running system, from the local runtime's workload
    records (what a sandbox create or resume could claim now)."""
    import nats

    from shared.bus.topology import KV_WORKLOADS
    from shared.runtime.local.pools import is_pool_name
    from shared.runtime.local.records import WorkloadStore

    nc = await nats.connect(nats_url)
    try:
        store = WorkloadStore(await nc.jetstream().key_value(KV_WORKLOADS))
        count = 0
        for name in await store.names():
            current = await store.get(name) if is_pool_name(name) else None
            record = current[0] if current else None
            if record and record.pool and not record.pool.claimed_by and record.pod:
                count += record.pod.ready
        return count
    finally:
        await nc.close()
