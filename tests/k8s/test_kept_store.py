"""``torpor.dev/persist: store`` on Kubernetes: a sandbox's /home/user and /workspace go to the
kept-files store (a real nats-server's object store) at pause and come back into its next pod
before it is served, on the warm-pool path and the cold path; a pool pod that served one
sandbox never carries its files into another; an upload that fails leaves the pod running; a
delete removes the object. Real apiserver and controller manager, the test kubelet running
the real daemon. One system for the module's one test (~60-90 s)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
import yaml
from kubernetes.aio import client as k8s

from shared.bus.kept_files import NatsKeptFiles
from shared.bus.server import EmbeddedNats
from shared.bus.topology import ensure_kept_files
from shared.errors import NotFound, Unavailable
from shared.ports.kept_files import KeptKey
from shared.ports.workloads import Endpoint, WorkloadSpec
from shared.runtime.kubernetes import DEFAULT_TEMPLATES, KubernetesRuntime, PodTemplates
from shared.runtime.kubernetes.objects import ANNOTATION_PERSIST
from shared.runtime.kubernetes.pools import LABEL_POOL
from tests.k8s.kubelet import TestKubelet
from tests.k8s.rig import ClusterAccess
from tests.k8s.test_runtime_kubernetes import pods_of

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(300)]

TEMPLATE = "sandbox-kept"
TOKEN = "kept-store-t0ken"


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(data_dir=tmp_path_factory.mktemp("kept-store-nats")).start()
    yield server
    server.stop()


def write_template(folder: Path) -> Path:
    document: dict[str, Any] = yaml.safe_load((DEFAULT_TEMPLATES / "sandbox-base.yaml").read_text())
    document["metadata"]["name"] = TEMPLATE
    meta = document["template"].setdefault("metadata", {})
    meta.setdefault("annotations", {})[ANNOTATION_PERSIST] = "store"
    (folder / f"{TEMPLATE}.yaml").write_text(yaml.safe_dump(document))
    return folder


@pytest.fixture
async def runtimes(
    tmp_path: Path,
    bus: EmbeddedNats,
    k8s_cluster: ClusterAccess,
    k8s_kubelet: TestKubelet,
    k8s_namespace: str,
) -> AsyncIterator[tuple[KubernetesRuntime, KubernetesRuntime]]:
    """The scaler's runtime with a pool of one, and one without pools (every pod cold)."""
    nc = await nats.connect(bus.url)
    await ensure_kept_files(nc.jetstream(), replicas=1, max_bytes=64 * 1024**2)
    await nc.close()
    templates = PodTemplates(write_template(tmp_path), DEFAULT_TEMPLATES)
    made = []
    for pools in ({TEMPLATE: 1}, {}):
        made.append(
            await KubernetesRuntime.from_kubeconfig(
                Path(k8s_cluster.kubeconfig),
                namespace=k8s_namespace,
                templates=templates,
                pools=pools,
                kept_files=NatsKeptFiles.connecting(bus.url),
            )
        )
    made[0].start_pools(interval=0.2, claim_timeout=30)
    yield made[0], made[1]
    for runtime in made:
        await runtime.close()


async def until_warm(rt: KubernetesRuntime) -> None:
    for _ in range(600):
        if await rt.warm_pods(TEMPLATE) >= 1:
            return
        await asyncio.sleep(0.2)
    pytest.fail("no warm pod within 120 s")


async def put(ep: Endpoint, path: str, data: bytes, token: str = TOKEN) -> None:
    async with httpx.AsyncClient(trust_env=False, timeout=30) as c:
        r = await c.post(
            f"{ep.base_url}/files",
            params={"path": path},
            content=data,
            headers={"X-Access-Token": token, "Content-Type": "application/octet-stream"},
        )
    assert r.status_code == 200, r.text


async def get(ep: Endpoint, path: str, token: str = TOKEN) -> bytes | None:
    async with httpx.AsyncClient(trust_env=False, timeout=30) as c:
        r = await c.get(
            f"{ep.base_url}/files", params={"path": path}, headers={"X-Access-Token": token}
        )
    if r.status_code == 404:
        return None
    assert r.status_code == 200, r.text
    return r.content


async def pause(rt: KubernetesRuntime, name: str) -> None:
    """What a pause does: the snapshotter keeps the files, then the scaler scales to 0."""
    assert await rt.keep_files(name) > 0
    await rt.scale(name, 0)
    await rt.wait_stopped(name, timeout=60)


async def stored_key(bus: EmbeddedNats, key: KeptKey) -> bool:
    store = NatsKeptFiles.connecting(bus.url)
    try:
        with tempfile.TemporaryFile() as fh:
            return await store.get(key, fh)
    finally:
        await store.close()


async def stored(bus: EmbeddedNats, name: str) -> bool:
    return await stored_key(bus, KeptKey.sandbox(name))


async def test_kept_files_come_back_into_a_warm_and_a_cold_pod(
    runtimes: tuple[KubernetesRuntime, KubernetesRuntime],
    bus: EmbeddedNats,
    admin_api: k8s.ApiClient,
    k8s_cluster: ClusterAccess,
    tmp_path: Path,
) -> None:
    pooled, cold = runtimes
    name = "sbx-store"
    await until_warm(pooled)
    await pooled.create(
        WorkloadSpec(name=name, owner="alice", template=TEMPLATE, access_token=TOKEN)
    )
    first = await pooled.wait_ready(name, timeout=60)
    assert first.warm
    await put(first, "/home/user/notes/today.txt", b"kept across a pause")
    await put(first, "/workspace/data.bin", bytes(range(256)) * 400)

    # Warm path: paused, then resumed into another pool pod, files in before it is served.
    await pause(pooled, name)
    await until_warm(pooled)
    await pooled.scale(name, 1)
    second = await pooled.wait_ready(name, timeout=60)
    assert second.warm
    assert second.pod_uid != first.pod_uid
    assert await get(second, "/home/user/notes/today.txt") == b"kept across a pause"
    assert await get(second, "/workspace/data.bin") == bytes(range(256)) * 400
    await put(second, "/home/user/notes/today.txt", b"changed while running warm")

    # Cold path: a runtime without pools starts a pod of its own.
    await pause(cold, name)
    await cold.scale(name, 1)
    third = await cold.wait_ready(name, timeout=90)
    assert not third.warm
    assert third.pod_uid not in {first.pod_uid, second.pod_uid}
    assert await get(third, "/home/user/notes/today.txt") == b"changed while running warm"
    (pod,) = await pods_of(admin_api, cold.namespace, name)
    assert not pod["metadata"]["name"].startswith("pool-")

    # A new sandbox from the pool: a fresh pod, none of the first one's files.
    await until_warm(pooled)
    other = "sbx-store-other"
    await pooled.create(
        WorkloadSpec(name=other, owner="bob", template=TEMPLATE, access_token="tok-bob")
    )
    theirs = await pooled.wait_ready(other, timeout=60)
    assert theirs.warm
    assert theirs.pod_uid not in {first.pod_uid, second.pod_uid, third.pod_uid}
    assert await get(theirs, "/home/user/notes/today.txt", token="tok-bob") is None
    assert await get(theirs, "/workspace/data.bin", token="tok-bob") is None
    assert not await stored(bus, other)  # never paused: nothing stored, nothing restored

    # An upload that fails (no such bucket) fails the keep; the pod keeps running.
    broken = await KubernetesRuntime.from_kubeconfig(
        Path(k8s_cluster.kubeconfig),
        namespace=cold.namespace,
        templates=PodTemplates(tmp_path, DEFAULT_TEMPLATES),
        kept_files=NatsKeptFiles.connecting(bus.url, bucket="torpor_no_such_bucket"),
    )
    try:
        with pytest.raises(Unavailable):
            await broken.keep_files(name)
    finally:
        await broken.close()
    workload = await cold.get(name)
    assert workload is not None
    assert workload.replicas == 1
    assert workload.ready_replicas == 1
    assert workload.pod_uid == third.pod_uid
    assert await get(third, "/home/user/notes/today.txt") == b"changed while running warm"

    # Snapshots and forks: a running sandbox's files through its daemon, a paused one's object
    # copied; a sandbox made from the snapshot gets them in its first pod.
    running_snap, paused_snap = "snap-" + "r" * 20, "snap-" + "p" * 20
    assert await cold.save_files(name, running_snap) > 0
    fork = "sbx-store-fork"
    await cold.create(
        WorkloadSpec(
            name=fork, owner="alice", template=TEMPLATE, access_token="tok-fork", replicas=0
        )
    )
    await cold.restore_files(running_snap, fork)
    await cold.scale(fork, 1)
    forked = await cold.wait_ready(fork, timeout=90)
    assert (
        await get(forked, "/home/user/notes/today.txt", "tok-fork") == b"changed while running warm"
    )
    await cold.delete_snapshot_files(running_snap)
    with pytest.raises(NotFound):
        await cold.restore_files(running_snap, fork)
    await cold.delete(fork)
    await pause(cold, name)
    assert await cold.save_files(name, paused_snap) > 0
    assert await stored_key(bus, KeptKey.snapshot(paused_snap))
    await cold.delete_snapshot_files(paused_snap)
    assert not await stored_key(bus, KeptKey.snapshot(paused_snap))

    # Deleting the sandbox deletes its object.
    assert await stored(bus, name)
    await cold.delete(name)
    assert not await stored(bus, name)
    await pooled.delete(other)
    pools = [
        p
        for p in (await k8s.CoreV1Api(admin_api).list_namespaced_pod(cold.namespace)).items
        if LABEL_POOL in (p.metadata.labels or {})
    ]
    assert all(p.metadata.uid != first.pod_uid for p in pools)
