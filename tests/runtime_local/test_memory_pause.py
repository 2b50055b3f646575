"""The local runtime's memory-keeping pause (shared/runtime/local/memory.py): a scale to 0 dumps
the pod's tree, the next scale to 1 restores it as the same pod (same secret, pid and count in
memory, same address), with PID 1 restored non-dumpable; a files-only pause, a refused or a
broken image come back as a fresh pod that says why."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import uuid
from pathlib import Path

import pytest

from shared.ports.workloads import (
    ANNOTATION_PAUSE_MEMORY,
    ANNOTATION_RESUME_MEMORY,
    Endpoint,
    WorkloadSpec,
)
from shared.runtime.local import LocalRuntime, checkpoint, memory, procfs
from tests.conftest import skip_or_fail
from tests.runtime_local.support import LocalRuntimeFactory
from tests.support import counter_pod

pytestmark = pytest.mark.timeout(240)


async def _counter_sandbox(
    local_runtime: LocalRuntimeFactory, tmp_path: Path
) -> tuple[LocalRuntime, str, Endpoint]:
    """A runtime that can dump, and a started counter pod on it: the runtime, its name, its
    endpoint."""
    rt = await local_runtime(templates_dir=counter_pod.write_template(tmp_path / "t"))
    if not rt.checkpoints.available:
        skip_or_fail(f"CRIU is not usable here: {rt.checkpoints.reason}")
    name = f"sbx-{uuid.uuid4().hex[:10]}"
    await rt.create(WorkloadSpec(name=name, owner="alice", template=counter_pod.TEMPLATE))
    return rt, name, await rt.wait_ready(name, timeout=30)


async def _pause(rt: LocalRuntime, name: str) -> None:
    await rt.scale(name, 0)
    await rt.wait_stopped(name, timeout=60)


def _memory_readable(pid: int) -> bool:
    """Whether a process of the task's own host uid, without capabilities, may open its
    ``/proc/<pid>/mem`` (ptrace's access check: a non-dumpable task refuses it)."""
    uid = _status(pid, "Uid").split()[0]  # as the host sees it
    gid = _status(pid, "Gid").split()[0]
    probe = f"open('/proc/{pid}/mem', 'rb').close()"
    done = subprocess.run(
        [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
            "/usr/bin/python3",
            "-c",
            probe,
        ],
        capture_output=True,
        text=True,
        check=False,
    )

    assert done.returncode == 0 or "PermissionError" in done.stderr, done.stderr
    return done.returncode == 0


def _status(pid: int, key: str) -> str:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return next(line.split(":", 1)[1].strip() for line in lines if line.startswith(key + ":"))


async def test_a_paused_pod_comes_back_with_its_memory_and_pid1_not_dumpable(
    local_runtime: LocalRuntimeFactory, data_dir: Path, tmp_path: Path
) -> None:
    rt, name, ep = await _counter_sandbox(local_runtime, tmp_path)
    assert not ep.memory_kept
    # Opt-in for now: without the annotation a pause keeps files only (the second test).
    await rt.patch_annotations(name, {ANNOTATION_PAUSE_MEMORY: "true"})
    before, secret, inside_pid = await counter_pod.ask(ep)
    boot_id = (data_dir / "pods" / ep.pod_uid / "boot_id").read_text()
    first = await rt._store.get(name)
    started = first[0].pod if first is not None else None
    assert started is not None
    pid1 = procfs.inner_pid(started.pid)
    assert pid1 is not None and _memory_readable(pid1)  # bubblewrap keeps itself dumpable

    await _pause(rt, name)
    images = data_dir / "layers" / name / memory.IMAGES
    st = os.stat(images)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o700)
    assert all(os.stat(e.path).st_uid == 0 for e in os.scandir(images))
    assert checkpoint.pid1_dumpable(images) == 0  # sealed at the dump
    assert not (data_dir / "pods" / ep.pod_uid).exists()  # torn down as any pause

    await rt.scale(name, 1)
    back = await rt.wait_ready(name, timeout=60)
    assert back.memory_kept and back.memory_note is None
    assert (back.host, back.pod_uid) == (ep.host, ep.pod_uid)  # the same pod, same address
    after, same_secret, same_pid = await counter_pod.ask(back)
    assert (same_secret, same_pid) == (secret, inside_pid)
    assert after > before
    await asyncio.sleep(0.3)
    assert (await counter_pod.ask(back))[0] > after
    assert (data_dir / "pods" / ep.pod_uid / "boot_id").read_text() == boot_id  # no reboot
    assert not images.exists()  # used once
    # PID 1 of the restored pod is not dumpable (ptrace needs CAP_SYS_PTRACE over it), and it
    # is in the pod's cgroup.
    current = await rt.get(name)
    assert current is not None and current.pod_uid == ep.pod_uid
    stored = await rt._store.get(name)
    assert stored is not None
    [pod] = stored[0].pods()
    assert pod.memory_kept
    assert _status(pod.pid, "NSpid").split()[-1] == "1"
    assert not _memory_readable(pod.pid)
    assert ep.pod_uid in Path(f"/proc/{pod.pid}/cgroup").read_text()

    # A second pause of the restored pod keeps memory again.
    await _pause(rt, name)
    assert checkpoint.pid1_dumpable(images) == 0
    await rt.scale(name, 1)
    again = await rt.wait_ready(name, timeout=60)
    assert again.memory_kept
    assert (await counter_pod.ask(again))[1:] == (secret, inside_pid)


async def test_files_only_pause_and_broken_images_start_fresh_with_the_reason(
    local_runtime: LocalRuntimeFactory, data_dir: Path, tmp_path: Path
) -> None:
    rt, name, ep = await _counter_sandbox(local_runtime, tmp_path)
    _, secret, _ = await counter_pod.ask(ep)
    images = data_dir / "layers" / name / memory.IMAGES

    # memory: false: nothing dumped, a fresh pod that says so.
    await rt.patch_annotations(name, {ANNOTATION_PAUSE_MEMORY: "false"})
    await _pause(rt, name)
    assert not images.exists()
    await rt.scale(name, 1)
    fresh = await rt.wait_ready(name, timeout=60)
    assert not fresh.memory_kept and "memory: false" in (fresh.memory_note or "")
    _, new_secret, _ = await counter_pod.ask(fresh)
    assert new_secret != secret

    # Not asked for: files only too (opt-in until the scaler handles a restored pod).
    await rt.patch_annotations(name, {ANNOTATION_PAUSE_MEMORY: None})
    await _pause(rt, name)
    assert not images.exists()
    await rt.scale(name, 1)
    plain = await rt.wait_ready(name, timeout=60)
    assert not plain.memory_kept and "not asked for" in (plain.memory_note or "")

    # A broken image: the restore fails, the pod starts fresh, the reason is kept.
    await rt.patch_annotations(name, {ANNOTATION_PAUSE_MEMORY: "true"})
    await _pause(rt, name)
    pages = sorted(images.glob("pages-*.img"))
    assert pages
    for page in pages:
        page.write_bytes(b"")
    next(images.glob("core-*.img")).write_bytes(b"\0" * 16)
    await rt.scale(name, 1)
    broken = await rt.wait_ready(name, timeout=60)
    assert not broken.memory_kept
    assert "the restore failed" in (broken.memory_note or ""), broken.memory_note
    assert not images.exists()
    # A new pod, not the dumped one under its uid (the scaler replays into a new uid only).
    assert broken.pod_uid != plain.pod_uid

    # Another sandbox's images (or a pod's other than the one paused) are refused.
    await _pause(rt, name)
    meta = images / checkpoint.META
    meta.write_text(meta.read_text().replace(name, "sbx-someone-else"))
    await rt.scale(name, 1)
    foreign = await rt.wait_ready(name, timeout=60)
    assert not foreign.memory_kept
    assert "not this" in (foreign.memory_note or ""), foreign.memory_note
    assert foreign.pod_uid != broken.pod_uid

    # A reboot (the resume's memory: false): good images are dropped, a new pod starts.
    await _pause(rt, name)
    assert (images / checkpoint.META).is_file()
    await rt.patch_annotations(name, {ANNOTATION_RESUME_MEMORY: "false"})
    await rt.scale(name, 1)
    rebooted = await rt.wait_ready(name, timeout=60)
    assert not rebooted.memory_kept and rebooted.pod_uid != foreign.pod_uid
    assert "booted from the kept files" in (rebooted.memory_note or ""), rebooted.memory_note
    assert not images.exists()
