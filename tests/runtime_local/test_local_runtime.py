"""What only the local runtime promises: bubblewrap isolation, volumes, surviving its owner."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import uuid
from pathlib import Path

import pytest

from shared.errors import ConfigError, Conflict, RuntimeFailure
from shared.ports.workloads import Endpoint, WorkloadSpec
from shared.runtime.local import limits as local_limits
from shared.runtime.local import procfs
from shared.runtime.local.layers import Layers
from tests.contract.harness import healthy, read_file, write_file
from tests.runtime_local.support import LocalRuntimeFactory, new_name, start_owner, started

pytestmark = pytest.mark.timeout(180)
READY = 30.0


def daemon_pid(data_dir: Path, pod_uid: str) -> int:
    """Host pid of the daemon (the deepest process) of a pod."""
    [outer] = [p.pid for p in procfs.scan_pods(data_dir) if p.uid == pod_uid]
    return procfs.descendants(outer)[-1]


async def test_sandboxes_cannot_see_each_other(
    local_runtime: LocalRuntimeFactory, data_dir: Path
) -> None:
    rt = await local_runtime()
    a, b = new_name(), new_name()
    await rt.create(WorkloadSpec(name=a, owner="alice"))
    await rt.create(WorkloadSpec(name=b, owner="bob"))
    ep_a = await rt.wait_ready(a, timeout=READY)
    ep_b = await rt.wait_ready(b, timeout=READY)
    assert ep_a.host != ep_b.host

    await write_file(ep_a, "/workspace/secret.txt", b"only for a")
    assert await read_file(ep_a, "/workspace/secret.txt") == b"only for a"
    assert await read_file(ep_b, "/workspace/secret.txt") is None
    host_copy = data_dir / "pods" / ep_a.pod_uid / "root" / "workspace" / "secret.txt"
    assert host_copy.read_bytes() == b"only for a"  # it is there on the host ...
    assert await read_file(ep_b, str(host_copy)) is None  # ... but not inside b
    kept = data_dir / "layers" / a / "mnt" / "upper" / "workspace" / "secret.txt"
    assert kept.read_bytes() == b"only for a"  # in a's writable layer ...
    assert await read_file(ep_b, str(kept)) is None  # ... which b cannot reach either

    # Only the daemon's code is visible, not the control plane's (or the data dir).
    import shared.errors

    assert Path(shared.errors.__file__).exists()
    assert await read_file(ep_b, shared.errors.__file__) is None

    # Own PID namespace: b's PID 1 is its bwrap init, and a's daemon does not exist for b.
    assert b"bwrap" in (await read_file(ep_b, "/proc/1/cmdline") or b"")
    pid_a = daemon_pid(data_dir, ep_a.pod_uid)
    assert Path(f"/proc/{pid_a}").exists()
    assert await read_file(ep_b, f"/proc/{pid_a}/cmdline") is None


async def test_files_are_kept_across_pods_and_deleted_with_the_workload(
    local_runtime: LocalRuntimeFactory, data_dir: Path
) -> None:
    rt = await local_runtime()
    name, first = await started(rt, timeout=READY)
    await write_file(first, "/workspace/scratch.txt", b"local disk")
    await write_file(first, "/home/user/notes.txt", b"in the home")
    await write_file(first, "/mnt/shared/kept.txt", b"network storage")

    await rt.scale(name, 0)
    await rt.wait_stopped(name, timeout=READY)
    assert not (data_dir / "pods" / first.pod_uid).exists(), "the old pod's folder was not removed"
    assert (data_dir / "volumes" / "alice" / name / "kept.txt").read_bytes() == b"network storage"
    layer = data_dir / "layers" / name
    assert (layer / "disk.img").is_file()  # sandbox-base has a disk limit: an ext4 image
    assert not _mounted(layer / "mnt"), "a stopped pod's layer stays mounted"

    await rt.scale(name, 1)
    second = await rt.wait_ready(name, timeout=READY)
    assert second.pod_uid != first.pod_uid
    assert await read_file(second, "/workspace/scratch.txt") == b"local disk"
    assert await read_file(second, "/home/user/notes.txt") == b"in the home"
    assert await read_file(second, "/mnt/shared/kept.txt") == b"network storage"

    await rt.delete(name)
    await rt.wait_stopped(name, timeout=READY)
    for _ in range(100):
        if not layer.exists():
            break
        await asyncio.sleep(0.05)
    assert not layer.exists(), "the deleted workload's kept files are still there"


async def test_persist_none_gives_every_pod_a_fresh_disk(
    local_runtime: LocalRuntimeFactory, data_dir: Path, tmp_path: Path
) -> None:
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "fresh.yaml").write_text(
        "persist: none\nworkdir: /home/user\nresources:\n  limits:\n    disk: 64Mi\n"
    )
    rt = await local_runtime(templates_dir=templates)
    name = new_name()
    await rt.create(WorkloadSpec(name=name, owner="alice", template="fresh"))
    first = await rt.wait_ready(name, timeout=READY)
    await write_file(first, "/home/user/scratch.txt", b"gone after the pod")
    await rt.scale(name, 0)
    await rt.wait_stopped(name, timeout=READY)
    assert not (data_dir / "layers" / name).exists()
    await rt.scale(name, 1)
    second = await rt.wait_ready(name, timeout=READY)
    assert await read_file(second, "/home/user/scratch.txt") is None


async def _record(rt: object, name: str) -> int:
    """The workload's host id base, from its record."""
    current = await rt._store.get(name)  # type: ignore[attr-defined]
    assert current is not None and current[0].id_base is not None
    return int(current[0].id_base)


def _mounted(path: Path) -> bool:
    from shared.runtime.local.mounts import is_mounted

    return is_mounted(path)


async def test_resource_limits_apply_to_the_daemon(
    local_runtime: LocalRuntimeFactory, data_dir: Path
) -> None:
    rt = await local_runtime()
    _, ep = await started(rt, timeout=READY)
    limits = (await read_file(ep, "/proc/self/limits") or b"").decode()
    open_files = next(line for line in limits.splitlines() if line.startswith("Max open files"))
    nofile = str(local_limits.capped_rlimit(resource.RLIMIT_NOFILE, 65536))  # from sandbox-base
    assert open_files.split()[3:5] == [nofile, nofile]
    cgroups = local_limits.Cgroups.detect(local_limits.instance_name(data_dir))
    if cgroups is None:  # no usable cgroups: memory is an address-space rlimit
        address_space = next(
            line for line in limits.splitlines() if line.startswith("Max address space")
        )
        assert address_space.split()[3] == str(2 * 2**30)
        return
    # The daemon is in the pod's cgroups, which carry sandbox-base's limits.
    folders = cgroups.folders(ep.pod_uid)
    assert all(folder.is_dir() for folder in folders)
    procs = cgroups.procs(ep.pod_uid)
    assert procs, "the pod's processes are not in its cgroups"
    if cgroups.v2:
        assert (folders[0] / "memory.max").read_text().strip() == str(2 * 2**30)
        assert (folders[0] / "pids.max").read_text().strip() == "1024"
    else:
        memory = cgroups.parents["memory"] / ep.pod_uid / "memory.limit_in_bytes"
        assert memory.read_text().strip() == str(2 * 2**30)
        assert (cgroups.parents["pids"] / ep.pod_uid / "pids.max").read_text().strip() == "1024"
        quota = cgroups.parents["cpu"] / ep.pod_uid / "cpu.cfs_quota_us"
        assert quota.read_text().strip() == "100000"


async def test_crashed_pod_is_restarted_with_a_new_uid(
    local_runtime: LocalRuntimeFactory, data_dir: Path
) -> None:
    rt = await local_runtime()
    name, first = await started(rt, timeout=READY)
    os.kill(daemon_pid(data_dir, first.pod_uid), signal.SIGKILL)
    deadline = asyncio.get_running_loop().time() + READY
    while True:
        ep = await rt.wait_ready(name, timeout=READY)
        if ep.pod_uid != first.pod_uid:
            break
        assert asyncio.get_running_loop().time() < deadline, "the crashed pod was not replaced"
        await asyncio.sleep(0.1)
    assert await healthy(ep)


@pytest.mark.slow
async def test_killed_owner_leaves_pods_running_for_the_next_owner(
    local_runtime: LocalRuntimeFactory, nats_url: str, data_dir: Path, bucket: str
) -> None:
    names = [new_name(), new_name()]
    owner, endpoints = await asyncio.to_thread(start_owner, nats_url, data_dir, bucket, names)
    owner.kill()  # kill -9: no cleanup at all
    owner.wait(10)
    await asyncio.sleep(0.5)
    assert {p.uid for p in procfs.scan_pods(data_dir)} == {e["pod_uid"] for e in endpoints.values()}

    rt = await local_runtime()
    for name in names:
        ep = await rt.wait_ready(name, timeout=READY)
        assert ep.pod_uid == endpoints[name]["pod_uid"], "the running pod was not adopted"
        assert await healthy(ep)
    await rt.close()
    assert procfs.scan_pods(data_dir) == [], "pods left behind after close"
    for raw in endpoints.values():
        assert not await healthy(Endpoint.model_validate(raw))

    # The records still want replicas=1: the next owner brings the pods back (new uids).
    rt = await local_runtime()
    for name in names:
        ep = await rt.wait_ready(name, timeout=READY)
        assert ep.pod_uid != endpoints[name]["pod_uid"]


@pytest.mark.slow
async def test_pods_without_a_record_are_stopped_on_start(
    local_runtime: LocalRuntimeFactory, nats_url: str, data_dir: Path, bucket: str
) -> None:
    owner, _endpoints = await asyncio.to_thread(
        start_owner, nats_url, data_dir, bucket, [new_name()]
    )
    owner.kill()
    owner.wait(10)
    assert len(procfs.scan_pods(data_dir)) == 1
    # Same data dir, other bucket: the running pod has no record there, so it is a stray.
    await local_runtime(bucket=f"wl_{uuid.uuid4().hex[:12]}")
    assert procfs.scan_pods(data_dir) == []


async def test_missing_bwrap_is_one_clear_config_error(local_runtime: LocalRuntimeFactory) -> None:
    with pytest.raises(ConfigError) as err:
        await local_runtime(bwrap="/nonexistent/bwrap")
    message = str(err.value)
    assert "\n" not in message
    assert "bubblewrap" in message
    assert "apt-get install -y bubblewrap" in message


async def test_bwrap_without_namespaces_is_one_clear_config_error(
    local_runtime: LocalRuntimeFactory, tmp_path: Path
) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(ConfigError) as err:
        await local_runtime(bwrap=str(fake))
    message = str(err.value)
    assert "\n" not in message
    assert "cannot create namespaces" in message
    assert "No permissions" in message
    assert "apt-get install -y bubblewrap" in message


HOSTILE_NAMES = [
    "--ro-bind",
    "../etc",
    "a/b",
    "a\x00b",
    "UPPER",
    "a" * 64,
    "",
    "-a",
    "a-",
    "pool-x",
]


async def test_hostile_workload_names_are_refused_before_anything_is_made(
    local_runtime: LocalRuntimeFactory, data_dir: Path
) -> None:
    """A workload name becomes a KV key, a hostname, a folder and a bwrap argument: one rule
    (a DNS label, never a pool pod's name) for the runtime and for the layers' folders."""
    runtime = await local_runtime()
    for bad in HOSTILE_NAMES:
        with pytest.raises(RuntimeFailure, match="invalid workload name"):
            await runtime.create(WorkloadSpec(name=bad, owner="alice", replicas=0))
        if bad != "pool-x":  # a valid folder name: only the runtime keeps it for its pools
            with pytest.raises(RuntimeFailure, match="invalid workload name"):
                Layers(data_dir).folder(bad)
    assert await runtime.list() == []
    assert Layers(data_dir).names() == set()


async def test_two_runtimes_on_one_bucket_run_one_pod(
    local_runtime: LocalRuntimeFactory, data_dir: Path
) -> None:
    """Several services may each hold a LocalRuntime: records, not memory, decide."""
    a = await local_runtime()
    b = await local_runtime(stop_pods_on_close=False)
    name = new_name()
    await a.create(WorkloadSpec(name=name, owner="alice", replicas=0))
    await asyncio.gather(a.scale(name, 1), b.scale(name, 1))
    ep_b = await b.wait_ready(name, timeout=READY)
    ep_a = await a.wait_ready(name, timeout=READY)
    assert ep_a == ep_b
    await asyncio.sleep(0.5)  # both monitors had a look
    assert [p.uid for p in procfs.scan_pods(data_dir)] == [ep_a.pod_uid]
    await b.delete(name)
    assert await a.get(name) is None
    assert procfs.scan_pods(data_dir) == []


async def test_access_token_is_not_on_a_command_line(
    local_runtime: LocalRuntimeFactory, data_dir: Path
) -> None:
    """The token reaches the daemon through bwrap's ``--args`` descriptor, not argv (which any
    local user reads in ``ps``); one starting with "-" is not taken for an option; processes the
    daemon starts do not inherit it."""
    import httpx

    from shared.envd.client import ConnectEnvdClient
    from shared.models.snapshots import ProcessConfig

    rt = await local_runtime()
    name = new_name()
    token = "-looks-like-an-option-" + uuid.uuid4().hex
    await rt.create(WorkloadSpec(name=name, owner="alice", access_token=token))
    ep = await rt.wait_ready(name, timeout=READY)
    [outer] = [p.pid for p in procfs.scan_pods(data_dir) if p.uid == ep.pod_uid]
    for pid in [outer, *procfs.descendants(outer)]:
        assert token.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert not list((data_dir / "pods" / ep.pod_uid).glob("env*")), "the env file stayed on disk"

    async with httpx.AsyncClient(trust_env=False) as http:
        url = f"http://{ep.host}:{ep.port}/envs"
        assert (await http.get(url)).status_code == 401
        assert (await http.get(url, headers={"X-Access-Token": token})).status_code == 200

    envd = ConnectEnvdClient()
    try:
        pid = await envd.start_process(
            ep,
            ProcessConfig(cmd="/bin/sh", args=["-c", "env > /workspace/env.txt"]),
            tag=None,
            access_token=token,
        )
        assert pid > 0
        for _ in range(100):
            seen = data_dir / "pods" / ep.pod_uid / "root" / "workspace" / "env.txt"
            if seen.exists() and seen.read_text().strip():
                break
            await asyncio.sleep(0.05)
        env = seen.read_text()
        assert f"E2B_SANDBOX_ID={name}" in env
        assert "ENVD_ACCESS_TOKEN" not in env
        assert token not in env
    finally:
        await envd.close()


async def test_kept_files_export_and_start_another_sandbox(
    local_runtime: LocalRuntimeFactory, data_dir: Path, tmp_path: Path
) -> None:
    """The snapshot code's port: a paused sandbox's files copied out (ids its own), and a new
    sandbox (another id range) started from them; hostile: not while a pod runs, not into a
    layer that has files."""
    rt = await local_runtime()
    source, target = new_name(), new_name()
    await rt.create(WorkloadSpec(name=source, owner="alice"))
    ep = await rt.wait_ready(source, timeout=READY)
    await write_file(ep, "/home/user/from-source.txt", b"copied")
    with pytest.raises(Conflict):
        await rt.export_files(source, tmp_path / "early")
    await rt.scale(source, 0)
    await rt.wait_stopped(source, timeout=READY)
    exported = tmp_path / "exported"
    await rt.export_files(source, exported)
    copied = exported / "home" / "user" / "from-source.txt"
    assert copied.read_bytes() == b"copied"
    # write_file runs as the daemon's default user: uid 1000 inside, stored as 1000.
    assert (copied.stat().st_uid, copied.stat().st_gid) == (1000, 1000)

    await rt.create(WorkloadSpec(name=target, owner="alice", replicas=0))
    await rt.import_files(target, exported)
    with pytest.raises(Conflict):
        await rt.import_files(target, exported)  # not into a layer that has files
    await rt.scale(target, 1)
    started = await rt.wait_ready(target, timeout=READY)
    assert await read_file(started, "/home/user/from-source.txt") == b"copied"
    host_copy = data_dir / "pods" / started.pod_uid / "root" / "home" / "user" / "from-source.txt"
    record = await _record(rt, target)
    assert host_copy.stat().st_uid == record + 1000  # shifted into the new sandbox's range
