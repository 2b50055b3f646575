"""Warm pools of the local runtime (shared/runtime/local/pools.py): real bubblewrap pods, a real
nats-server, the real daemon. One pair of runtimes (two "scaler replicas" sharing one data dir
and bucket) serves the whole module; the kill -9 test has its own."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.errors import RuntimeFailure
from shared.ports.workloads import Endpoint, WorkloadSpec
from shared.runtime.local import LocalRuntime, procfs
from shared.runtime.local import limits as local_limits
from shared.runtime.local.pools import slot_name
from tests.conftest import skip_or_fail
from tests.runtime_local.support import TEMPLATES, new_name, runtime_kwargs
from tests.support.pods import release_pods

pytestmark = pytest.mark.timeout(240)
READY = 60.0
TEMPLATE = "sandbox-base"
SIZE = 2


def token_of(name: str) -> str:
    return f"token-{name}"


async def until(check: Any, what: str, within: float = READY) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await check():
        if loop.time() > deadline:
            pytest.fail(f"{what} not within {within:g}s")
        await asyncio.sleep(0.1)


async def pool_full(rt: LocalRuntime) -> None:
    async def full() -> bool:
        return await rt.warm_pods(TEMPLATE) >= SIZE

    await until(full, f"{SIZE} warm pods")


async def pool_uids(rt: LocalRuntime) -> set[str]:
    uids = set()
    for slot in range(SIZE):
        current = await rt._store.get(slot_name(TEMPLATE, slot))
        if current is not None and current[0].pod is not None:
            uids.add(current[0].pod.uid)
    return uids


def cpu_weight(data_dir: Path, uid: str) -> str | None:
    """The pod's cgroup v2 ``cpu.weight`` (None without cgroup v2 delegation)."""
    path = local_limits.CGROUP_ROOT / local_limits.instance_name(data_dir) / uid / "cpu.weight"
    try:
        return path.read_text().strip()
    except OSError:
        return None


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pools") / "local-runtime"


@pytest.fixture(scope="module")
async def runtimes(nats_url: str, data_dir: Path) -> AsyncIterator[tuple[LocalRuntime, ...]]:
    """Two supervising runtimes on one data dir and bucket, each keeping the same pool."""
    import shutil

    if shutil.which("bwrap") is None:
        skip_or_fail("bubblewrap (bwrap) is not installed")
    kwargs = {
        **runtime_kwargs(nats_url, data_dir, f"wl_{uuid.uuid4().hex[:12]}"),
        "pools": {TEMPLATE: SIZE},
        "pool_claim_timeout": 2.0,
    }
    started: list[LocalRuntime] = []
    try:
        for _ in range(2):
            started.append(await LocalRuntime(**kwargs).start())
        await pool_full(started[0])
        yield tuple(started)
    finally:
        for rt in reversed(started):
            await rt.close()
        await release_pods(data_dir)


class Daemon:
    """The sandbox's daemon as its clients see it: with the sandbox's token."""

    def __init__(self, ep: Endpoint, token: str) -> None:
        self.ep, self.token = ep, token

    def _client(self) -> httpx.AsyncClient:
        headers = {"X-Access-Token": self.token}
        return httpx.AsyncClient(trust_env=False, timeout=10, headers=headers)

    async def read(self, path: str) -> bytes | None:
        async with self._client() as c:
            r = await c.get(f"{self.ep.base_url}/files", params={"path": path})
        if r.status_code == 404:
            return None
        assert r.status_code == 200, r.text
        return r.content

    async def write(self, path: str, data: bytes, user: str = "user") -> None:
        async with self._client() as c:
            r = await c.post(
                f"{self.ep.base_url}/files",
                params={"path": path, "username": user},
                files={"file": data},
            )
        assert r.status_code == 200, r.text

    async def owner(self, path: str) -> str:
        async with self._client() as c:
            r = await c.post(
                f"{self.ep.base_url}/filesystem.Filesystem/Stat",
                json={"path": path},
                headers={"Content-Type": "application/json"},
            )
        assert r.status_code == 200, r.text
        return str(r.json()["entry"]["owner"])

    async def envs(self) -> dict[str, str]:
        async with self._client() as c:
            r = await c.get(f"{self.ep.base_url}/envs")
        assert r.status_code == 200, r.text
        return dict(r.json())


async def status_with(ep: Endpoint, token: str | None) -> int:
    headers = {"X-Access-Token": token} if token else {}
    async with httpx.AsyncClient(trust_env=False, timeout=10, headers=headers) as c:
        return (await c.get(f"{ep.base_url}/envs")).status_code


async def test_create_and_resume_claim_warm_pods_bound_to_the_sandbox(
    runtimes: tuple[LocalRuntime, ...], data_dir: Path
) -> None:
    rt = runtimes[0]
    await pool_full(rt)
    warm = await pool_uids(rt)
    secrets = set()
    for slot in range(SIZE):
        current = await rt._store.get(slot_name(TEMPLATE, slot))
        assert current is not None and current[0].access_token
        secrets.add(current[0].access_token)
    name = new_name()
    spec = WorkloadSpec(
        name=name, owner="alice", access_token=token_of(name), envs={"FOO": "--ro-bind"}
    )
    # Waiting pods yield the CPU (cgroup v2 here: cpu.weight 10), a claimed one gets 100.
    assert {cpu_weight(data_dir, uid) for uid in warm} <= {"10", None}
    await rt.create(spec)
    ep = await rt.wait_ready(name, timeout=READY)
    assert ep.warm and ep.pod_uid in warm
    assert cpu_weight(data_dir, ep.pod_uid) in {"100", None}

    # Bound at claim: the pool's one-time token is dead, the sandbox's works; its env, its
    # hostname, its volume.
    for secret in secrets:
        assert await status_with(ep, secret) == 401
    assert await status_with(ep, None) == 401
    daemon = Daemon(ep, token_of(name))
    envs = await daemon.envs()
    assert envs["FOO"] == "--ro-bind" and envs["E2B_SANDBOX_ID"] == name
    assert await daemon.read("/proc/sys/kernel/hostname") == f"{name}\n".encode()
    assert await daemon.read("/etc/hostname") == f"{name}\n".encode()
    await daemon.write("/mnt/shared/v.txt", b"volume")
    assert (data_dir / "volumes" / "alice" / name / "v.txt").read_bytes() == b"volume"
    await daemon.write("/home/user/notes.txt", b"kept across the pause")
    assert await daemon.owner("/home/user/notes.txt") == "user"

    # Resume into a warm pod: its kept layer becomes the pod's root, owned by the sandbox's user.
    await rt.scale(name, 0)
    await rt.wait_stopped(name, timeout=READY)
    await pool_full(rt)
    warm = await pool_uids(rt)
    await rt.scale(name, 1)
    again = await rt.wait_ready(name, timeout=READY)
    assert again.warm and again.pod_uid in warm and again.pod_uid != ep.pod_uid
    daemon = Daemon(again, token_of(name))
    assert await daemon.read("/home/user/notes.txt") == b"kept across the pause"
    assert await daemon.owner("/home/user/notes.txt") == "user"
    assert await daemon.read("/mnt/shared/v.txt") == b"volume"
    assert await daemon.read("/proc/sys/kernel/hostname") == f"{name}\n".encode()
    # The daemon works in the new root: a new file lands in the kept layer.
    await daemon.write("/home/user/after.txt", b"new")
    assert (await daemon.envs())["FOO"] == "--ro-bind"
    # Nothing of the pool pod's own disk is left, and the layer is the sandbox's alone.
    layers = {p.name for p in (data_dir / "layers").iterdir() if not p.name.startswith(".")}
    assert name in layers

    await rt.scale(name, 0)
    await rt.wait_stopped(name, timeout=READY)
    await rt.scale(name, 1)
    cold_or_warm = await rt.wait_ready(name, timeout=READY)
    assert await Daemon(cold_or_warm, token_of(name)).read("/home/user/after.txt") == b"new"
    await rt.delete(name)


async def test_a_pool_pod_carries_nothing_of_its_previous_life(
    runtimes: tuple[LocalRuntime, ...], data_dir: Path
) -> None:
    rt = runtimes[0]
    await pool_full(rt)
    first, second = new_name(), new_name()
    await rt.create(WorkloadSpec(name=first, owner="alice", access_token=token_of(first)))
    ep = await rt.wait_ready(first, timeout=READY)
    assert ep.warm
    daemon = Daemon(ep, token_of(first))
    for path in ("/home/user/secret.txt", "/tmp/secret.txt", "/mnt/shared/secret.txt"):
        await daemon.write(path, b"first's")
    await rt.delete(first)
    await rt.wait_stopped(first, timeout=READY)
    assert ep.pod_uid not in {p.uid for p in procfs.scan_pods(data_dir)}
    assert ep.pod_uid not in await pool_uids(rt)

    await pool_full(rt)
    await rt.create(WorkloadSpec(name=second, owner="alice", access_token=token_of(second)))
    ep2 = await rt.wait_ready(second, timeout=READY)
    assert ep2.warm and ep2.pod_uid != ep.pod_uid
    daemon2 = Daemon(ep2, token_of(second))
    for path in ("/home/user/secret.txt", "/tmp/secret.txt", "/mnt/shared/secret.txt"):
        assert await daemon2.read(path) is None, path
    assert (await daemon2.envs())["E2B_SANDBOX_ID"] == second
    assert await status_with(ep2, token_of(first)) == 401
    await rt.delete(second)


async def test_concurrent_claims_on_two_runtimes_never_share_a_pod(
    runtimes: tuple[LocalRuntime, ...],
) -> None:
    """Five creates at once on two runtimes (two scaler replicas) against a pool of two: every
    sandbox gets its own pod, the pool serves at most its ready pods and the rest start cold,
    and the pool is full again afterwards (its size holds under churn)."""
    await pool_full(runtimes[0])
    warm = await pool_uids(runtimes[0])
    names = [new_name() for _ in range(5)]

    async def create(i: int, name: str) -> Endpoint:
        rt = runtimes[i % 2]
        await rt.create(WorkloadSpec(name=name, owner="bob", access_token=token_of(name)))
        return await rt.wait_ready(name, timeout=READY)

    eps = await asyncio.gather(*(create(i, n) for i, n in enumerate(names)))
    assert len({ep.pod_uid for ep in eps}) == len(names)
    assert len({ep.host for ep in eps}) == len(names)
    from_pool = [ep for ep in eps if ep.warm]
    assert from_pool, "no create claimed a warm pod"
    assert {ep.pod_uid for ep in from_pool} <= warm
    assert any(not ep.warm for ep in eps), "more warm pods than the pool held"
    for name, ep in zip(names, eps, strict=True):
        envs = await Daemon(ep, token_of(name)).envs()  # each pod takes its own sandbox's token
        assert envs.get("E2B_SANDBOX_ID", name) == name
    await pool_full(runtimes[0])
    pool_names = [n for n in await runtimes[0]._store.names() if n.startswith("pool-")]
    live = [n for n in pool_names if await runtimes[0]._store.get(n) is not None]
    assert len(live) == SIZE
    await asyncio.gather(*(runtimes[i % 2].delete(n) for i, n in enumerate(names)))


async def test_pool_names_and_settings_refuse_hostile_values(
    runtimes: tuple[LocalRuntime, ...],
) -> None:
    from shared.settings import parse_pools

    with pytest.raises(RuntimeFailure):
        await runtimes[0].create(WorkloadSpec(name=slot_name(TEMPLATE, 0), owner="mallory"))
    for bad in ("sandbox-base", "sandbox-base=-1", "--ro-bind=1", "a\0b=1", "x=99999", "x=1,x=2"):
        with pytest.raises(ValueError):
            parse_pools(bad)
    assert parse_pools(" sandbox-base=2, other.t=0 ") == {"sandbox-base": 2, "other.t": 0}
    # A pool pod is nobody's workload.
    assert all(not w.name.startswith("pool-") for w in await runtimes[0].list())


@pytest.mark.slow
async def test_kill9_of_the_owner_during_claims_leaves_no_orphan_pods(
    nats_url: str, tmp_path: Path
) -> None:
    data_dir = tmp_path / "local-runtime"
    bucket = f"wl_{uuid.uuid4().hex[:12]}"
    burst = [new_name() for _ in range(4)]
    argv = [
        sys.executable,
        str(Path(__file__).with_name("owner_process.py")),
        *("--nats-url", nats_url, "--data-dir", str(data_dir), "--bucket", bucket),
        *("--pool", f"{TEMPLATE}={SIZE}"),
    ]
    if TEMPLATES is not None:
        argv += ["--templates-dir", str(TEMPLATES)]
    for name in burst:
        argv += ["--burst", name]
    owner = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    rt = None
    try:
        assert owner.stdout is not None
        for line in owner.stdout:  # kill -9 right after a claim's first step
            if "runtime_local_pool_claimed" in line:
                break
        else:
            pytest.fail(f"the owner exited with {owner.wait(10)} before claiming")
        owner.kill()
        owner.wait(10)

        rt = await LocalRuntime(
            **{
                **runtime_kwargs(nats_url, data_dir, bucket),
                "pools": {TEMPLATE: SIZE},
                "pool_claim_timeout": 1.0,
            }
        ).start()
        created = [n for n in burst if await rt.get(n) is not None]  # the kill may come first
        assert created, "no create reached the store before the kill"
        for name in created:
            ep = await rt.wait_ready(name, timeout=READY)
            envs = await Daemon(ep, token_of(name)).envs()  # bound to its sandbox (or cold)
            assert envs.get("E2B_SANDBOX_ID", name) == name
        await pool_full(rt)

        async def settled() -> bool:
            held: list[str] = []
            for name in await rt._store.names():
                current = await rt._store.get(name)
                if current is None:
                    continue
                record = current[0]
                if record.pool is not None and record.pool.claimed_by:
                    return False  # a claim still to finish or clean up
                held += [p.uid for p in [record.pod, *record.terminating] if p is not None]
            running = {p.uid for p in procfs.scan_pods(data_dir)}
            return len(held) == len(set(held)) and running == set(held)

        await until(settled, "every running pod held by exactly one record")
        for name in created:
            await rt.delete(name)
    finally:
        if owner.poll() is None:
            owner.kill()
        if rt is not None:
            await rt.close()
        left = procfs.scan_pods(data_dir)
        await release_pods(data_dir)
        assert left == [], "pods left behind"


async def test_pool_pods_of_an_older_template_are_never_claimed_and_refill_with_the_new(
    nats_url: str, tmp_path: Path
) -> None:
    """The template changes while a warm pod of it waits: a create right after the change gets
    no pod of the old version, the pool drains and refills with the new one, which the next
    create and a resume (onto its kept layer) claim."""
    import shutil

    import yaml

    from shared.runtime.templates import PACKAGED_TEMPLATES_DIR, load_template, template_version

    if shutil.which("bwrap") is None:
        skip_or_fail("bubblewrap (bwrap) is not installed")
    folder = tmp_path / "templates"
    folder.mkdir()
    source = (TEMPLATES or PACKAGED_TEMPLATES_DIR) / f"{TEMPLATE}.yaml"

    def set_mark(mark: str) -> str:
        document = yaml.safe_load(source.read_text())
        document.setdefault("env", {})["MARK"] = mark
        (folder / f"{TEMPLATE}.yaml").write_text(yaml.safe_dump(document))
        return template_version(load_template(TEMPLATE, [folder]))

    async def pool_pod() -> tuple[str, str | None] | None:
        current = await rt._store.get(slot_name(TEMPLATE, 0))
        if current is None or current[0].pod is None or not current[0].pod.ready:
            return None
        return current[0].pod.uid, current[0].pod.template_version

    async def pool_pod_is(version: str) -> bool:
        return (await pool_pod() or ("", None))[1] == version

    async def mark_of(ep: Endpoint, name: str) -> bytes:
        environ = await Daemon(ep, token_of(name)).read("/proc/self/environ")  # the daemon's
        assert environ is not None
        return next(v for v in environ.split(b"\0") if v.startswith(b"MARK="))

    data_dir = tmp_path / "local-runtime"
    v1 = set_mark("v1")
    kwargs = {
        **runtime_kwargs(nats_url, data_dir, f"wl_{uuid.uuid4().hex[:12]}"),
        "templates_dir": folder,
        "pools": {TEMPLATE: 1},
    }
    rt = await LocalRuntime(**kwargs).start()
    try:
        await until(lambda: pool_pod_is(v1), "a warm pod of v1")
        old = await pool_pod()
        assert old is not None
        v2 = set_mark("v2")
        first, second = new_name(), new_name()
        await rt.create(WorkloadSpec(name=first, owner="alice", access_token=token_of(first)))
        ep = await rt.wait_ready(first, timeout=READY)
        assert ep.pod_uid != old[0]
        assert await mark_of(ep, first) == b"MARK=v2"

        await until(lambda: pool_pod_is(v2), "a warm pod of v2")
        fresh = await pool_pod()
        assert fresh is not None
        assert old[0] not in {p.uid for p in procfs.scan_pods(data_dir)}  # drained
        await rt.create(WorkloadSpec(name=second, owner="alice", access_token=token_of(second)))
        ep = await rt.wait_ready(second, timeout=READY)
        assert ep.warm and ep.pod_uid == fresh[0]
        assert await mark_of(ep, second) == b"MARK=v2"

        # A paused sandbox resumes (onto its kept layer) on the template as it is then.
        await Daemon(ep, token_of(second)).write("/home/user/kept.txt", b"kept")
        await rt.scale(second, 0)
        await rt.wait_stopped(second, timeout=READY)
        v3 = set_mark("v3")
        await until(lambda: pool_pod_is(v3), "a warm pod of v3")
        newest = await pool_pod()
        assert newest is not None
        await rt.scale(second, 1)
        ep = await rt.wait_ready(second, timeout=READY)
        assert ep.warm and ep.pod_uid == newest[0]
        assert await mark_of(ep, second) == b"MARK=v3"
        assert await Daemon(ep, token_of(second)).read("/home/user/kept.txt") == b"kept"
        for name in (first, second):
            await rt.delete(name)
    finally:
        await rt.close()
        await release_pods(data_dir)
