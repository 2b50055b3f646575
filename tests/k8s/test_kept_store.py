"""``torpor.dev/persist: store`` on Kubernetes: a sandbox's /home/user and /workspace go to the
kept-files store (a real nats-server's object store) at pause and come back into its next pod
before it is served, on the warm-pool path and the cold path; a pool pod that served one
sandbox never carries its files into another; an upload that fails leaves the pod running; a
delete removes the object. Real apiserver and controller manager, the test kubelet running
the real daemon. One system for the module's one test (~60-90 s).

A process writing all the time is stopped for the export and held stopped until the pod is
gone: the file comes back exactly as it was at the stop, every line whole.

``[real-node]``: the same round trip in real containers (kubelet + containerd + runc, the
``sandbox-base`` image, daemon and files as the image's ``user``): a file written by a process
as ``user`` comes back owned by ``user`` in a warm pool container and a cold one, and hostile
tars imported into a real container write nothing outside home/user and workspace."""

from __future__ import annotations

import asyncio
import contextlib
import io
import tarfile
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
from tests.k8s.test_pools import remove_pool_pods
from tests.k8s.test_realnode import run_in_pod
from tests.k8s.test_runtime_kubernetes import pods_of
from tests.support.k8s.kubelet import TestKubelet
from tests.support.k8s.realnode import RealNodeAccess
from tests.support.k8s.rig import ClusterAccess
from tests.support.waiting import eventually

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
    made = await make_runtimes(bus, Path(k8s_cluster.kubeconfig), k8s_namespace, tmp_path, 30)
    yield made
    for runtime in made:
        await runtime.close()


async def make_runtimes(
    bus: EmbeddedNats, kubeconfig: Path, namespace: str, folder: Path, claim_timeout: float
) -> tuple[KubernetesRuntime, KubernetesRuntime]:
    nc = await nats.connect(bus.url)
    await ensure_kept_files(nc.jetstream(), replicas=1, max_bytes=64 * 1024**2)
    await nc.close()
    templates = PodTemplates(write_template(folder), DEFAULT_TEMPLATES)
    made = []
    for pools in ({TEMPLATE: 1}, {}):
        made.append(
            await KubernetesRuntime.from_kubeconfig(
                kubeconfig,
                namespace=namespace,
                templates=templates,
                pools=pools,
                kept_files=NatsKeptFiles.connecting(bus.url),
            )
        )
    made[0].start_pools(interval=0.2, claim_timeout=claim_timeout)
    return made[0], made[1]


async def until_warm(rt: KubernetesRuntime, timeout: float = 120) -> None:
    async def warm() -> bool:
        return await rt.warm_pods(TEMPLATE) >= 1

    await eventually(warm, timeout, f"no warm pod within {timeout} s")


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


async def pause(rt: KubernetesRuntime, name: str, timeout: float = 60) -> None:
    """What a pause does: the snapshotter keeps the files, then the scaler scales to 0."""
    assert await rt.keep_files(name) > 0
    await rt.scale(name, 0)
    await rt.wait_stopped(name, timeout=timeout)


LINES = "/home/user/lines.txt"


async def start_writer(ep: Endpoint) -> None:
    loop = f'i=0; while :; do i=$((i+1)); echo "line $i" >> {LINES}; sleep 0.01; done'
    _, code = await run_in_pod(ep, ["/bin/sh", "-c", f"({loop}) >/dev/null 2>&1 &"], token=TOKEN)
    assert code == 0


async def until_grown(ep: Endpoint, than: bytes, timeout: float = 30) -> None:
    for _ in range(int(timeout * 20)):
        now = await get(ep, LINES)
        if now is not None and len(now) > len(than):
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"{LINES} did not grow past {len(than)} bytes within {timeout} s")


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

    # A process appending a line every ~10 ms, outside the daemon's tree (its shell exited): a
    # held keep stops it until thaw_files; the pause's keep holds it until the pod is gone, so
    # the file read right before the stop is exactly what comes back, every line whole.
    await start_writer(second)
    await until_grown(second, b"")
    assert await cold.keep_files(name, hold=60) > 0
    held = await get(second, LINES)
    assert held is not None
    await cold.thaw_files(name)
    await until_grown(second, held)
    assert await cold.keep_files(name, hold=60) > 0
    at_stop = await get(second, LINES)
    await cold.scale(name, 0)
    await cold.wait_stopped(name, timeout=60)

    # Cold path: a runtime without pools starts a pod of its own.
    await cold.scale(name, 1)
    third = await cold.wait_ready(name, timeout=90)
    assert not third.warm
    assert third.pod_uid not in {first.pod_uid, second.pod_uid}
    assert await get(third, "/home/user/notes/today.txt") == b"changed while running warm"
    back = await get(third, LINES)
    assert back is not None and back == at_stop  # nothing written after the copy was lost
    lines = back.decode().splitlines()
    assert back.endswith(b"\n") and lines == [f"line {i}" for i in range(1, len(lines) + 1)]
    assert len(lines) > held.count(b"\n")  # it ran on after the thaw
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


def tar_of(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, *, link: str = "", mode: int = 0o644) -> Any:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.uid, info.gid = kind, link, mode, 0, 0
    return info


def pax_named(name: str) -> Any:
    info = member("home/user/plain")
    info.pax_headers = {"path": name}  # a PAX record keeps the NUL (a ustar field cuts there)
    return info


# Each one alone is refused with 400 and writes nothing outside home/user and workspace.
HOSTILE_TARS = [
    [(member("home/user/../../../tmp/evil-dotdot"), b"x")],
    [(member("workspace/../tmp/evil-ws"), b"x")],
    [(member("/tmp/evil-abs"), b"x")],
    [(member("tmp/evil-top"), b"x")],
    [
        (member("home/user/esc", tarfile.SYMTYPE, link="/tmp"), b""),
        (member("home/user/esc/evil-abslink"), b"x"),
    ],
    [
        (member("home/user/up", tarfile.SYMTYPE, link="../../../tmp"), b""),
        (member("home/user/up/evil-rellink"), b"x"),
    ],
    [(member("home/user/hard", tarfile.LNKTYPE, link="/etc/passwd"), b"")],
    [(pax_named("home/user/a\x00/../../../tmp/evil-nul"), b"x")],
    [(member("home/user/dev", tarfile.CHRTYPE), b"")],
]


@pytest.mark.realnode
@pytest.mark.timeout(1200)  # the first realnode test pays for the session's node start
async def test_kept_files_of_a_real_container_come_back_owned_by_user(
    bus: EmbeddedNats, real_node: RealNodeAccess, real_namespace: str, tmp_path: Path
) -> None:
    """In real containers (the image's ``user``, uid 1000, no capabilities): a file written by a
    process in /home/user, paused, comes back in a warm pool container and then a cold one,
    still ``user``'s with its mode; a held export stops the container's processes until
    thaw_files; a fresh container refuses hostile tars (nothing lands outside home/user and
    workspace) and imports a root-owned setuid member as ``user``'s, setuid gone."""
    from tests.support.k8s.plugin import admin_client

    ns = real_namespace
    pooled, cold = await make_runtimes(bus, Path(real_node.cluster.kubeconfig), ns, tmp_path, 120)
    name, fresh = "sbx-rn-store", "sbx-rn-hostile"
    show = "stat -c '%U %u %a' /home/user/notes/today.txt; cat /home/user/notes/today.txt"
    try:
        await until_warm(pooled, timeout=300)
        await pooled.create(
            WorkloadSpec(name=name, owner="alice", template=TEMPLATE, access_token=TOKEN)
        )
        first = await pooled.wait_ready(name, timeout=180)
        assert first.warm
        out, code = await run_in_pod(
            first,
            [
                "/bin/sh",
                "-c",
                "mkdir /home/user/notes && echo kept > /home/user/notes/today.txt"
                " && chmod 640 /home/user/notes/today.txt && echo w > /workspace/w.txt && " + show,
            ],
            token=TOKEN,
        )
        assert (code, out.split()) == (0, ["user", "1000", "640", "kept"])

        # Warm: into another pool container, the files in before it is served.
        await pause(pooled, name, timeout=120)
        await until_warm(pooled, timeout=300)
        await pooled.scale(name, 1)
        second = await pooled.wait_ready(name, timeout=180)
        assert second.warm and second.pod_uid != first.pod_uid
        out, code = await run_in_pod(second, ["/bin/sh", "-c", show], token=TOKEN)
        assert (code, out.split()) == (0, ["user", "1000", "640", "kept"])

        # Cold: a container of its own (no pool), the same.
        await pause(cold, name, timeout=120)
        await cold.scale(name, 1)
        third = await cold.wait_ready(name, timeout=300)
        assert not third.warm and third.pod_uid not in {first.pod_uid, second.pod_uid}
        out, code = await run_in_pod(
            third, ["/bin/sh", "-c", show + "; cat /workspace/w.txt"], token=TOKEN
        )
        assert (code, out.split()) == (0, ["user", "1000", "640", "kept", "w"])

        # The export stops the container's processes (tini is PID 1, the daemon runs as user
        # without capabilities) and a hold keeps them stopped until thaw_files. While held the
        # daemon refuses a process start (it would run unfrozen) but serves reads: the sleep's
        # state is read through /files.
        _, code = await run_in_pod(
            third, ["/bin/sh", "-c", "sleep 3601 >/dev/null 2>&1 &"], token=TOKEN
        )
        assert code == 0
        state = (
            "for p in /proc/[0-9]*; do tr '\\0' ' ' 2>/dev/null < $p/cmdline"
            " | grep -q '^sleep 3601' && cut -d' ' -f3 $p/stat; done; true"
        )
        find = state.replace("-f3", "-f1")
        (sleeper,) = (await run_in_pod(third, ["/bin/sh", "-c", find], token=TOKEN))[0].split()
        assert await cold.keep_files(name, hold=60) > 0
        raw = await get(third, f"/proc/{sleeper}/stat")
        assert raw is not None and raw[raw.rfind(b")") + 2 :].split()[0] == b"T", raw
        assert await run_in_pod(third, ["/bin/true"], token=TOKEN) == ("", -1)  # refused
        await cold.thaw_files(name)
        out, _ = await run_in_pod(third, ["/bin/sh", "-c", state], token=TOKEN)
        assert out.split() == ["S"], out
        await cold.delete(name)

        # A fresh container (no process ran yet: imports are open) against hostile tars.
        await cold.create(
            WorkloadSpec(name=fresh, owner="mallory", template=TEMPLATE, access_token="tok-m")
        )
        ep = await cold.wait_ready(fresh, timeout=300)
        headers = {"X-Access-Token": "tok-m", "Content-Type": "application/x-tar"}
        post = {"params": {"limit": str(1 << 20)}, "headers": headers}
        async with httpx.AsyncClient(trust_env=False, timeout=60) as c:
            for members in HOSTILE_TARS:
                r = await c.post(f"{ep.base_url}/kept-files", content=tar_of(*members), **post)
                assert r.status_code == 400, (members[-1][0].name, r.status_code, r.text)
                words = r.json()["message"]
                assert any(w in words for w in ("refused", "not under", "NUL", "hard links")), words
            ok = tar_of(
                (member("home/user/suid", mode=0o4777), b"#!/bin/sh\n"),
                (member("workspace/deep/er/f.txt"), b"f"),
            )
            r = await c.post(f"{ep.base_url}/kept-files", content=ok, **post)
            assert r.status_code == 200, r.text
            assert r.json()["files"] == 2
        out, code = await run_in_pod(
            ep,
            [
                "/bin/sh",
                "-c",
                "stat -c '%U %a' /home/user/suid /workspace/deep/er/f.txt;"
                " ls -A /tmp /home/user /workspace; find / -xdev -name 'evil*' 2>/dev/null; true",
            ],
            token="tok-m",
        )
        assert code == 0, out
        lines = out.splitlines()
        assert lines[:2] == ["user 755", "user 644"], out  # user's, setuid and o+w gone
        assert "evil" not in out, out
        assert not any(entry in {"esc", "up", "hard", "dev"} for entry in out.split()), out
    finally:
        for rt, n in ((cold, name), (cold, fresh)):
            with contextlib.suppress(Exception):
                await rt.delete(n)
        for rt in (pooled, cold):
            await rt.close()
        # The node is the session's: leave no pool container holding its cpu.
        api = await admin_client(real_node.cluster)
        try:
            await remove_pool_pods(api, ns)
        finally:
            await api.close()  # type: ignore[no-untyped-call]
