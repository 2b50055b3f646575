"""Nothing of the pod network is left behind: after a runtime (and its pods) is killed with
SIGKILL the next start removes exactly its own instance's namespaces, links and rules (another
instance's survive), and `torpor up` leaves no link, namespace, rule, route or process when it
stops, also when it is restarted after a SIGKILL of everything; an instance killed and then
deleted (its data dir gone, no process in its namespaces) is removed by the next one that opens."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from e2b import Sandbox

from shared.models.network import NetworkPolicy
from shared.runtime.local import LocalRuntime, procfs, volume_fs
from shared.runtime.local.network import PodNetwork, release_instance
from shared.runtime.local.pod_dirs import unmount_stopped
from tests.runtime_local.support import start_owner
from tests.security.network_support import leftovers, require_root_network, sh
from tests.support.pods import instance_processes
from tests.support.stack import Stack

pytestmark = pytest.mark.slow


def kill9_pods(data_dir: Path) -> None:
    for pod in procfs.scan_pods(data_dir):
        for pid in [pod.pid, *procfs.descendants(pod.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def taken_over(leftover: str) -> bool:
    """What a crash leaves that the restarted instance takes over instead of removing: a
    sandbox's kept layer (its next pod mounts it again) and the volumes' filesystem
    (.volume_fs: one per data dir, found mounted)."""
    return "/layers/" in leftover or leftover.endswith(f"/{volume_fs.FOLDER}")


def wait_no_pods(data_dir: Path) -> None:
    deadline = time.monotonic() + 20
    while procfs.scan_pods(data_dir):
        assert time.monotonic() < deadline, "pods survived SIGKILL"
        time.sleep(0.1)


async def test_restart_after_kill9_removes_only_its_own_leftovers(
    nats_url: str, tmp_path: Path
) -> None:
    require_root_network()
    data_dir, bucket = tmp_path / "rt", f"wl_{uuid.uuid4().hex[:12]}"
    names = [f"sbx-{uuid.uuid4().hex[:10]}" for _ in range(2)]
    owner, _ = start_owner(nats_url, data_dir, bucket, names)
    # Another instance on the same host, with a pod network of its own.
    other = await PodNetwork(tmp_path / "other").open()
    other_pod = "0fedcba"
    await other.setup(other_pod, other.address(2), NetworkPolicy())
    try:
        owner.kill()  # SIGKILL: the runtime, then its pods, die without any cleanup
        owner.wait(10)
        kill9_pods(data_dir)
        wait_no_pods(data_dir)
        before = leftovers(data_dir)
        # Two pods' links, namespaces and the namespaces' mounts, plus the table; and the pods'
        # roots, layers and the volumes' filesystem (taken over by the next instance).
        pods_mounts = f"mount {data_dir.resolve()}/"
        assert len([n for n in before if not n.startswith(("table", pods_mounts))]) == 6, before
        assert any(n.startswith(f"{pods_mounts}pods/") for n in before), before
        before = [n for n in before if not taken_over(n)]
        rt = LocalRuntime(nats_url=nats_url, data_dir=data_dir, bucket=bucket, stop_grace=1.0)
        await rt.start()
        try:
            # The records still want their pods: new ones run, on fresh namespaces.
            for name in names:
                await rt.wait_ready(name, timeout=60)
            after = set(leftovers(data_dir))
            assert not after & {n for n in before if not n.startswith("table")}
        finally:
            await rt.close()
        assert leftovers(data_dir) == []
        assert procfs.scan_pods(data_dir) == []
        # The other instance was not touched.
        assert other.names.link(other_pod) in leftovers(tmp_path / "other")
        assert other.names.table in sh("nft", "list", "tables")
    finally:
        await other.release()
    assert leftovers(tmp_path / "other") == []


def _sandbox(up: Stack) -> Sandbox:
    return Sandbox.create(template="sandbox-base", timeout=300, **up.sdk_opts("alice"))


def _leave_nothing(data_dir: Path) -> None:
    """Whatever point the test stopped at (a failed assertion, its timeout, Ctrl-C between the
    crash and the restart, or during a stop's grace): no process, mount or network object of
    either instance outlives it. ``Stack.stop`` does the same, but an interrupt inside it skips
    its rest, and the crashed instance's overlay and loop mounts left under pytest's folders make
    every later run warn once per file when it sweeps old folders."""
    for pid in instance_processes(data_dir, zombies=True):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(AssertionError):  # a pod still dying: unmounted lazily
        wait_no_pods(data_dir)
    unmount_stopped(data_dir)
    asyncio.run(release_instance(data_dir))


@pytest.mark.timeout(900)  # two whole instances one after the other; slow on a loaded machine
def test_torpor_up_restarted_after_kill9_then_stopped_leaves_nothing(tmp_path: Path) -> None:
    require_root_network()
    first_stack = Stack.up(tmp_path / "first")
    data_dir = first_stack.data_dir  # the second instance restarts on it
    try:
        _crash_then_restart(first_stack, tmp_path / "second")
    finally:
        _leave_nothing(data_dir)
    assert leftovers(data_dir) == []


def _crash_then_restart(first_stack: Stack, second_root: Path) -> None:
    with first_stack.running() as first:
        data_dir = first.data_dir
        sbx = _sandbox(first)
        assert sbx.commands.run("echo hi").stdout == "hi\n"
        # Crash: SIGKILL `torpor up`, its services and its pods at once.
        for pid in instance_processes(data_dir, zombies=True):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        first.procs["up"].wait(10)
        wait_no_pods(data_dir)
        # A crash leaves the pod's namespace, link and mounts behind (and what the next
        # instance takes over) ...
        crashed = [
            n for n in leftovers(data_dir) if not n.startswith("table") and not taken_over(n)
        ]
        assert any(n.startswith("mount ") for n in crashed) and len(crashed) > 1
        with Stack.up(second_root, data_dir=data_dir).running() as second:
            # ... which the restarted instance removes (its pods get fresh ones).
            again = Sandbox.connect(sbx.sandbox_id, **second.sdk_opts("alice"))
            assert again.commands.run("echo again").stdout == "again\n"
            assert not set(crashed) & set(leftovers(data_dir))
            second.procs["up"].send_signal(signal.SIGINT)
            assert second.procs["up"].wait(60) == 0
            # A clean stop leaves nothing: no link, namespace, table, mount, pod or process.
            assert leftovers(data_dir) == [], "torpor up left host objects behind"
            assert procfs.scan_pods(data_dir) == []
            assert instance_processes(data_dir, zombies=True) == []


async def test_an_instance_whose_data_dir_is_gone_is_removed_by_the_next(tmp_path: Path) -> None:
    require_root_network()
    gone, busy = PodNetwork(tmp_path / "gone"), PodNetwork(tmp_path / "busy")
    await gone.open()
    await busy.open()
    await gone.setup("0000001", gone.address(2), NetworkPolicy())
    await busy.setup("0000002", busy.address(2), NetworkPolicy())
    # A process still in busy's pod namespace: its instance is not dead, folder or not.
    sleeper = subprocess.Popen([*busy.enter_prefix("0000002"), "sleep", "60"])
    live = None
    try:
        shutil.rmtree(tmp_path / "gone")
        shutil.rmtree(tmp_path / "busy")
        assert leftovers(tmp_path / "gone") and leftovers(tmp_path / "busy")
        live = await PodNetwork(tmp_path / "live").open()
        assert leftovers(tmp_path / "gone") == []
        assert str(gone.subnet) not in sh("ip", "route", "show", "table", "all")
        assert busy.names.link("0000002") in leftovers(tmp_path / "busy")
    finally:
        sleeper.kill()
        sleeper.wait()
        for net in (gone, busy, live):
            if net is not None:
                await net.release()
    assert leftovers(tmp_path / "busy") == leftovers(tmp_path / "live") == []
