"""CRIU checkpoints of a real local pod (user namespace, idmapped overlay root, pod network):
a process started before the dump keeps its memory and its listening socket after the restore,
and the restored tree keeps the pod's isolation."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import uuid
from pathlib import Path

import pytest

from shared.models.network import NetworkPolicy
from shared.ports.workloads import WorkloadSpec
from shared.runtime.local import checkpoint, procfs
from shared.runtime.local.network import PodNetwork
from shared.runtime.local.network.names import pod_net_id
from tests.conftest import skip_or_fail
from tests.runtime_local.support import LocalRuntimeFactory
from tests.support import counter_pod

pytestmark = pytest.mark.timeout(180)


async def _criu() -> str:
    criu = checkpoint.default_criu()
    capability = await checkpoint.probe(criu)
    if not capability.available:
        skip_or_fail(f"CRIU is not usable here: {capability.reason}")
    assert criu is not None
    return criu


async def test_a_pod_restored_from_its_checkpoint_keeps_its_memory_and_isolation(
    local_runtime: LocalRuntimeFactory, data_dir: Path, tmp_path: Path
) -> None:
    criu = await _criu()
    # The owner closes without stopping its pods: no reconciler restarts the pod while it is
    # dumped.
    rt = await local_runtime(
        stop_pods_on_close=False, templates_dir=counter_pod.write_template(tmp_path / "t")
    )
    name = f"sbx-{uuid.uuid4().hex[:10]}"
    await rt.create(WorkloadSpec(name=name, owner="alice", template=counter_pod.TEMPLATE))
    assert rt.checkpoints.available, rt.checkpoints.reason  # probed at start-up
    ep = await rt.wait_ready(name, timeout=30)
    before, secret, inside_pid = await counter_pod.ask(ep)
    await rt.close()

    [outer] = [p.pid for p in procfs.scan_pods(data_dir) if p.uid == ep.pod_uid]
    inner = procfs.inner_pid(outer)
    assert inner is not None
    uid_map = Path(f"/proc/{inner}/uid_map").read_text()
    assert uid_map.split()[:2] == ["0", uid_map.split()[1]] and uid_map.split()[1] != "0"
    enter = PodNetwork(data_dir).enter_prefix(pod_net_id(ep.pod_uid))
    images = tmp_path / "images"
    criu_ = checkpoint.Criu(criu)
    await criu_.dump(checkpoint.PodTree(pid=inner, enter=enter), images)
    assert checkpoint.is_dead(inner)  # the tree is gone with the dump

    # Host-owned images the sandbox's ids cannot read.
    st = os.stat(images)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o700)
    assert all(os.stat(e.path).st_uid == 0 for e in os.scandir(images))

    read_end, write_end = os.pipe()
    target = checkpoint.RestoreTarget(
        root=data_dir / "pods" / ep.pod_uid / "root", enter=enter, output_fd=write_end
    )
    try:
        pid = await criu_.restore(target, images)
    finally:
        os.close(write_end)
    try:
        # The same user namespace map, namespaces of its own, not host root.
        assert Path(f"/proc/{pid}/uid_map").read_text() == uid_map
        for ns in ("user", "pid", "mnt", "ipc", "uts"):
            assert os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}")
        assert os.stat(f"/proc/{pid}").st_uid == int(uid_map.split()[1])
        # The process's memory came back: same secret, same pid inside, the count goes on.
        after, same_secret, same_pid = await counter_pod.ask(ep)
        assert (same_secret, same_pid) == (secret, inside_pid)
        assert after > before
        await asyncio.sleep(0.3)
        assert (await counter_pod.ask(ep))[0] > after
        # Nested user namespaces stay forbidden in the restored namespace.
        nested = subprocess.run(
            ["nsenter", f"--user=/proc/{pid}/ns/user", "cat", "/proc/sys/user/max_user_namespaces"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert nested.stdout.strip() == "0"
        # The restored PID 1 is still the pod's bwrap, found as a pod of this data dir.
        assert ep.pod_uid in {p.uid for p in procfs.scan_pods(data_dir)}
    finally:
        os.close(read_end)

    # Hostile: images that are not a private folder of root's are refused.
    os.chmod(images, 0o755)
    with pytest.raises(checkpoint.CheckpointFailure, match="private folder"):
        await criu_.restore(target, images)
    # ... and so are images without the dump's record.
    os.chmod(images, 0o700)
    (images / checkpoint.META).unlink()
    with pytest.raises(checkpoint.CheckpointFailure, match="incomplete"):
        await criu_.restore(target, images)


async def test_a_pod_restores_into_a_new_pod_network_with_its_address(
    local_runtime: LocalRuntimeFactory, data_dir: Path, tmp_path: Path
) -> None:
    criu = await _criu()
    rt = await local_runtime(
        stop_pods_on_close=False, templates_dir=counter_pod.write_template(tmp_path / "t")
    )
    name = f"sbx-{uuid.uuid4().hex[:10]}"
    await rt.create(WorkloadSpec(name=name, owner="alice", template=counter_pod.TEMPLATE))
    ep = await rt.wait_ready(name, timeout=30)
    before, secret, inside_pid = await counter_pod.ask(ep)
    await rt.close()

    [outer] = [p.pid for p in procfs.scan_pods(data_dir) if p.uid == ep.pod_uid]
    inner = procfs.inner_pid(outer)
    assert inner is not None
    enter = PodNetwork(data_dir).enter_prefix(pod_net_id(ep.pod_uid))
    images = tmp_path / "images"
    criu_ = checkpoint.Criu(criu)
    await criu_.dump(checkpoint.PodTree(pid=inner, enter=enter), images)
    assert checkpoint.is_dead(inner)  # the tree is gone with the dump

    # The pause removes the pod's network; the resume makes it again, same net id and address.
    network = await PodNetwork(data_dir).open()
    net_id = pod_net_id(ep.pod_uid)
    old_netns = os.stat(network.netns_path(net_id)).st_ino
    await network.teardown(net_id, ep.host)
    await network.setup(net_id, ep.host, NetworkPolicy())
    assert os.stat(network.netns_path(net_id)).st_ino != old_netns

    read_end, write_end = os.pipe()
    target = checkpoint.RestoreTarget(
        root=data_dir / "pods" / ep.pod_uid / "root", enter=enter, output_fd=write_end
    )
    try:
        pid = await criu_.restore(target, images)
    finally:
        os.close(write_end)
    try:
        # In the new namespace, on the same address, with its memory.
        after, same_secret, same_pid = await counter_pod.ask(ep)
        assert (same_secret, same_pid) == (secret, inside_pid)
        assert after > before
        await asyncio.sleep(0.3)
        assert (await counter_pod.ask(ep))[0] > after
        assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(network.netns_path(net_id)).st_ino
    finally:
        os.close(read_end)


async def test_the_probe_says_why_criu_cannot_be_used(tmp_path: Path) -> None:
    missing = await checkpoint.probe(None)
    assert not missing.available and "scripts/build-criu.sh" in missing.reason
    gone = await checkpoint.probe(str(tmp_path / "no-such-criu"))
    assert not gone.available and "--version failed" in gone.reason
    old = tmp_path / "old-criu"
    old.write_text("#!/bin/sh\necho 'Version: 3.17.1'\n")
    old.chmod(0o755)
    too_old = await checkpoint.probe(str(old))
    assert not too_old.available and "too old" in too_old.reason
    failing = tmp_path / "failing-criu"
    failing.write_text(
        "#!/bin/sh\n[ \"$1\" = check ] && { echo 'Error: vdso: Unexpected rt vDSO area'; exit 1; }\n"
        "echo 'Version: 4.2.1'\n"
    )
    failing.chmod(0o755)
    broken = await checkpoint.probe(str(failing))
    assert not broken.available and "vDSO" in broken.reason and broken.version == "Version: 4.2.1"
