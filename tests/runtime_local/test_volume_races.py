"""A sandbox swaps another sandbox's volume folder (or a parent of it) for a symlink to a host
folder between the host's check of that folder and its bind into the pod.

A template that mounts a parent folder (an owner-scoped ``volumes/{owner}`` beside the
per-sandbox ``volumes/{owner}/{sandbox_id}``) lets one sandbox rename the names in it. The swap
is made here at the worst moment, deterministically: after ``launcher._volumes`` made and
checked the folder, just before the pod's stage binds it (``spawning.spawn``). The stage used
to bind by path (``mount --bind "$1"``), so the pod got the host folder read-write; now the
folder is opened beneath the data dir and the stage refuses a bind that is not that folder."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shared.errors import PodNotReady, RuntimeFailure
from shared.ports.workloads import WorkloadSpec
from shared.runtime.local import bwrap, inject, spawning
from tests.contract.harness import read_file, write_file
from tests.runtime_local.support import LocalRuntimeFactory, new_name

pytestmark = pytest.mark.timeout(180)
SECRET = b"host only\n"


def _swap(folder: Path, aside: Path, host: Path) -> Callable[[], None]:
    """``folder`` moves to ``aside`` and becomes a symlink to ``host``; returns the undo."""
    os.rename(folder, aside)
    os.symlink(host, folder)

    def undo() -> None:
        os.unlink(folder)
        os.rename(aside, folder)

    return undo


def _swap_last(volumes: Path, name: str, host: Path) -> Callable[[], None]:
    """``volumes/alice/<name>`` becomes a symlink to ``host``."""
    folder = volumes / "alice" / name
    return _swap(folder, folder.with_name(f"{name}.aside"), host)


def _swap_parent(volumes: Path, name: str, host: Path) -> Callable[[], None]:
    """``volumes/alice`` becomes a symlink to ``host`` (which holds ``<name>/``)."""
    return _swap(volumes / "alice", volumes / "alice.aside", host)


@pytest.mark.parametrize("swap", [_swap_last, _swap_parent], ids=["last-name", "parent"])
async def test_a_volume_swapped_for_a_symlink_before_its_bind_binds_no_host_folder(
    local_runtime: LocalRuntimeFactory,
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    swap: Callable[[Path, str, Path], Callable[[], None]],
) -> None:
    name = new_name()
    host = tmp_path / "host"
    secret_dir = host if swap is _swap_last else host / name
    secret_dir.mkdir(parents=True)
    (secret_dir / "secret.txt").write_bytes(SECRET)
    before = {p: (p.stat().st_uid, p.stat().st_mode) for p in (host, secret_dir)}

    real_spawn = spawning.spawn
    attempts: list[str] = []

    async def swapping_spawn(*args: Any, **kwargs: Any) -> Any:
        undo = swap(data_dir / "volumes", name, host)
        try:
            process = await real_spawn(*args, **kwargs)
        except RuntimeFailure as e:
            attempts.append(str(e))
            raise
        finally:
            undo()
        attempts.append("started")
        return process

    monkeypatch.setattr(spawning, "spawn", swapping_spawn)
    rt = await local_runtime()
    await rt.create(WorkloadSpec(name=name, owner="alice"))
    try:
        endpoint = await rt.wait_ready(name, timeout=15)
    except PodNotReady:
        endpoint = None
    if endpoint is not None:  # the old code: the pod started with the swapped folder bound
        seen = await read_file(endpoint, "/mnt/shared/secret.txt")
        assert seen != SECRET, "the host folder was bound into the pod"
    assert attempts, "no pod start was tried"
    assert all("torpor-stage: refused" in a for a in attempts), attempts
    for path, (uid, mode) in before.items():  # nothing re-owned through the symlink
        assert (path.stat().st_uid, path.stat().st_mode) == (uid, mode)
    assert (secret_dir / "secret.txt").read_bytes() == SECRET

    # Without the swap the same sandbox starts and its volume works.
    monkeypatch.setattr(spawning, "spawn", real_spawn)
    endpoint = await rt.wait_ready(name, timeout=30)
    await write_file(endpoint, "/mnt/shared/kept.txt", b"volume")
    assert (data_dir / "volumes" / "alice" / name / "kept.txt").read_bytes() == b"volume"
    assert await read_file(endpoint, "/mnt/shared/secret.txt") is None


def test_a_warm_pods_volume_swapped_for_a_symlink_is_refused(tmp_path: Path) -> None:
    """A claimed warm pod gets its volumes cloned by path (``inject.apply``): a clone that is
    not the folder checked beneath the data dir is refused before anything is mounted. The
    target namespace is a throwaway one of this test's (``unshare --mount``)."""
    folder, host = tmp_path / "volume", tmp_path / "host"
    folder.mkdir()
    host.mkdir()
    (host / "secret.txt").write_bytes(SECRET)
    checked = bwrap.identity(os.stat(folder))
    os.rename(folder, tmp_path / "volume.aside")
    os.symlink(host, folder)
    target = f"/torpor-test-{uuid.uuid4().hex[:8]}"
    ns = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "60"])
    try:
        time.sleep(0.3)  # unshare has execed sleep in its namespace
        bind = inject.Bind(source=folder, target=target, owner=0, identity=checked)
        with pytest.raises(RuntimeFailure, match="refused"):
            inject.apply(ns.pid, [bind])
        assert target not in Path(f"/proc/{ns.pid}/mounts").read_text()
        # The same bind of the folder that was checked goes in.
        os.unlink(folder)
        os.rename(tmp_path / "volume.aside", folder)
        inject.apply(ns.pid, [bind])
        assert target in Path(f"/proc/{ns.pid}/mounts").read_text()
    finally:
        ns.kill()
        ns.wait()
        with contextlib.suppress(OSError):
            os.rmdir(target)
