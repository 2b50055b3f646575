"""The test kubelet: node and lease, binding, running pods as daemons, termination."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from kubernetes.aio import client as k8s
from kubernetes.aio.client.exceptions import ApiException

from shared.ports.workloads import LABEL_MANAGED_BY, MANAGED_BY
from tests.support.k8s.kubelet import REPO_ROOT, PodRun, TestKubelet, real_envd_available

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(120)]


def bare_pod(name: str, labels: dict[str, str]) -> k8s.V1Pod:
    return k8s.V1Pod.model_validate(
        {
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "automountServiceAccountToken": False,
                "containers": [{"name": "envd", "image": "torpor/sandbox-base"}],
            },
        }
    )


async def until(predicate: object, *, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():  # type: ignore[operator]
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.1)


async def test_node_is_ready_and_its_lease_is_held(
    k8s_kubelet: TestKubelet, admin_api: k8s.ApiClient
) -> None:
    node = await k8s.CoreV1Api(admin_api).read_node(k8s_kubelet.node_name)
    assert node.status is not None
    ready = next(c for c in node.status.conditions or [] if c.type == "Ready")
    assert ready.status == "True"
    lease = await k8s.CoordinationV1Api(admin_api).read_namespaced_lease(
        k8s_kubelet.node_name, "kube-node-lease"
    )
    assert lease.spec is not None
    assert lease.spec.renew_time is not None
    assert lease.spec.holder_identity == k8s_kubelet.node_name
    age = dt.datetime.now(dt.UTC) - lease.spec.renew_time
    assert age < dt.timedelta(seconds=3 * k8s_kubelet.lease_interval)


async def test_pod_runs_as_a_sandboxed_daemon_and_terminates(
    k8s_kubelet: TestKubelet, admin_api: k8s.ApiClient, k8s_namespace: str
) -> None:
    core, name = k8s.CoreV1Api(admin_api), f"pod-{uuid.uuid4().hex[:6]}"
    await core.create_namespaced_pod(k8s_namespace, bare_pod(name, {LABEL_MANAGED_BY: MANAGED_BY}))

    async def running() -> bool:
        pod = await core.read_namespaced_pod(name, k8s_namespace)
        assert pod.status is not None
        conditions = {c.type: c.status for c in pod.status.conditions or []}
        return pod.status.phase == "Running" and conditions.get("Ready") == "True"

    await until(running)
    pod = await core.read_namespaced_pod(name, k8s_namespace)
    assert pod.spec is not None
    assert pod.status is not None
    assert pod.metadata is not None
    assert pod.metadata.uid is not None
    assert pod.spec.node_name == k8s_kubelet.node_name
    ip = pod.status.pod_ip
    assert ip is not None
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(k8s_kubelet.ip_network)
    assert k8s_kubelet.running_ips()[pod.metadata.uid] == ip
    pid = k8s_kubelet.pid_of(pod.metadata.uid)
    assert pid is not None
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    if shutil.which("bwrap"):
        assert Path(argv[0].decode()).name == "bwrap"
        assert b"--unshare-pid" in argv
    if real_envd_available():  # the real in-sandbox daemon, not the stand-in
        assert b"services.envd" in argv
    async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
        assert (await client.get(f"http://{ip}:49983/health")).is_success

    await core.delete_namespaced_pod(name, k8s_namespace)  # default grace: the kubelet finishes it

    async def gone() -> bool:
        try:
            await core.read_namespaced_pod(name, k8s_namespace)
        except ApiException as e:
            return bool(e.status == 404)
        return False

    await until(gone)
    assert pod.metadata.uid not in k8s_kubelet.running_ips()
    async with httpx.AsyncClient(trust_env=False, timeout=2) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://{ip}:49983/health")


async def test_foreign_pods_are_left_alone(
    k8s_kubelet: TestKubelet, admin_api: k8s.ApiClient, k8s_namespace: str
) -> None:
    core = k8s.CoreV1Api(admin_api)
    await core.create_namespaced_pod(k8s_namespace, bare_pod("foreign", {"app": "other"}))
    await asyncio.sleep(2)
    pod = await core.read_namespaced_pod("foreign", k8s_namespace)
    assert pod.spec is not None
    assert pod.status is not None
    assert pod.spec.node_name is None
    assert pod.status.phase == "Pending"


# Addresses: a kubelet that is never started, its pods' addresses from a block no rig uses.


def idle_kubelet(folder: Path, locks: Path) -> TestKubelet:
    return TestKubelet(
        kubeconfig=folder / "unused", workdir=folder, ip_network="127.0.6.0/29", ip_locks=locks
    )


async def test_a_pod_stopped_twice_frees_only_the_address_it_still_holds(tmp_path: Path) -> None:
    """A deleted pod is stopped by its deletion, and again by the watch's DELETED event when
    that comes first: its address may be another pod's by then, whose daemon is still starting
    (nothing listens there yet), and a third pod must not get it too."""
    kubelet = idle_kubelet(tmp_path, tmp_path / "ips")
    gone = PodRun("uid-1", "ns", "gone", kubelet._allocate_ip("uid-1"), Path())
    await kubelet._kill(gone)
    starting = PodRun("uid-2", "ns", "starting", kubelet._allocate_ip("uid-2"), Path())
    assert starting.ip == gone.ip  # free once its daemon is stopped
    await kubelet._kill(gone)  # the DELETED event
    assert kubelet._allocate_ip("uid-3") != starting.ip


async def test_a_pod_deleted_while_its_process_starts_keeps_its_address(tmp_path: Path) -> None:
    """Stopped before its process exists, a pod's daemon may still be started (its start then
    stops it): the address stays held until then."""
    kubelet = idle_kubelet(tmp_path, tmp_path / "ips")
    run = PodRun("uid-1", "ns", "early", kubelet._allocate_ip("uid-1"), Path(), starting=True)
    await kubelet._kill(run)  # its deletion
    assert kubelet._allocate_ip("uid-2") != run.ip
    run.starting = False
    await kubelet._kill(run)  # its start, having seen the deletion
    assert kubelet._allocate_ip("uid-3") == run.ip


def test_two_kubelets_of_one_machine_never_hand_out_one_address(tmp_path: Path) -> None:
    """Another test run's kubelet (another process, the same lock folder) skips the addresses
    this one's pods hold, though their daemons do not listen yet."""
    locks = tmp_path / "ips"
    kubelet = idle_kubelet(tmp_path, locks)
    mine = PodRun("uid-1", "ns", "mine", kubelet._allocate_ip("uid-1"), Path())
    other = f"""
from pathlib import Path
from tests.support.k8s.kubelet import TestKubelet
k = TestKubelet(kubeconfig=Path("unused"), workdir=Path({str(tmp_path)!r}),
                ip_network="127.0.6.0/29", ip_locks=Path({str(locks)!r}))
print(k._allocate_ip("theirs"))
"""

    def theirs() -> str:
        done = subprocess.run(
            [sys.executable, "-c", other], capture_output=True, text=True, check=True, cwd=REPO_ROOT
        )
        return done.stdout.strip()

    assert theirs() != mine.ip
    kubelet._release_ip(mine)
    assert theirs() == mine.ip  # held no more (and the other process's lock ended with it)
