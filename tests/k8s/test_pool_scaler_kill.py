"""kill -9 of the real scaler service (``torpor run scaler`` on the Kubernetes runtime, commands
through the bus) in the middle of a warm-pool claim leaves no orphan pod: the restarted scaler
sweeps the abandoned claim after ``TORPOR_POOL_CLAIM_TIMEOUT`` and serves the redelivered create.

The kill lands mid-claim by construction, not by timing: the pool pod's daemon is stopped
(SIGSTOP; the test kubelet probes readiness only at start, so the pod stays claimable), so the
scaler's binding (``/init``) cannot finish; the test kills the scaler once the pod carries the
claim. Rig: real kube-apiserver and controller-manager, the test kubelet, the api and scaler
services with a nats-server of their own (tests/support/stack.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes.aio import client as k8s

from shared.ports.workloads import ENVD_PORT
from shared.runtime.kubernetes.pools import ANNOTATION_BOUND, ANNOTATION_CLAIMED, LABEL_POOL
from tests.k8s.test_pools import TEMPLATE, until_settled, write_template
from tests.support.k8s.kubelet import TestKubelet
from tests.support.k8s.rig import ClusterAccess
from tests.support.pods import processes_mentioning
from tests.support.stack import Stack

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(240)]

USER = "alice"


@pytest.fixture
async def kstack(
    tmp_path: Path, k8s_cluster: ClusterAccess, k8s_kubelet: TestKubelet, k8s_namespace: str
) -> AsyncIterator[Stack]:
    from tests.support.fixtures import need_bwrap

    need_bwrap()
    templates = write_template(tmp_path)
    stack = Stack(
        tmp_path / "stack",
        services=("api", "scaler"),
        runtime="kubernetes",
        fast_redelivery=True,  # the killed scaler's create comes back after 4 s
        templates={TEMPLATE: (templates / f"{TEMPLATE}.yaml").read_text()},
        env={
            "TORPOR_KUBECONFIG": str(k8s_cluster.kubeconfig),
            "TORPOR_NAMESPACE": k8s_namespace,
            "TORPOR_POOLS": f"{TEMPLATE}=1",
            "TORPOR_POOL_CLAIM_TIMEOUT": "2",
        },
    )
    async with stack:
        yield stack


async def pool_pods(core: k8s.CoreV1Api, ns: str) -> list[k8s.V1Pod]:
    return list((await core.list_namespaced_pod(ns, label_selector=LABEL_POOL)).items)


async def one_ready_pool_pod(core: k8s.CoreV1Api, ns: str) -> k8s.V1Pod:
    for _ in range(600):
        for pod in await pool_pods(core, ns):
            conditions = (pod.status.conditions or []) if pod.status else []
            if pod.status.pod_ip and any(
                c.type == "Ready" and c.status == "True" for c in conditions
            ):
                return pod
        await asyncio.sleep(0.2)
    pytest.fail("no ready pool pod within 120 s")


async def test_kill9_of_the_scaler_service_mid_claim_leaves_no_orphan_pod(
    kstack: Stack, k8s_namespace: str, admin_api: k8s.ApiClient
) -> None:
    core, ns = k8s.CoreV1Api(admin_api), k8s_namespace
    pool_pod = await one_ready_pool_pod(core, ns)
    # The pool pod's daemon (and its bwraps): by the address it listens on and by the pod's
    # uid (the kubelet's marks), so no other test run's pod is touched.
    stopped = sorted(
        set(processes_mentioning(f"{pool_pod.status.pod_ip}:{ENVD_PORT}"))
        & set(processes_mentioning(pool_pod.metadata.uid))
    )
    assert stopped, "the pool pod's daemon was not found"
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        async with kstack.aclient(USER, timeout=180) as http:
            # The api answers once a scaler created the sandbox: after the restart below.
            create = asyncio.ensure_future(
                http.post("/sandboxes", json={"templateID": TEMPLATE, "timeout": 300})
            )
            claimed = await until_claimed(core, ns, pool_pod.metadata.name)
            kstack.kill9("scaler")
            pod = await core.read_namespaced_pod(pool_pod.metadata.name, ns)
            notes = pod.metadata.annotations or {}
            assert ANNOTATION_BOUND not in notes, "the kill did not land mid-claim"
            assert not pod.metadata.owner_references  # not adopted either
            sandbox_id = notes[ANNOTATION_CLAIMED]
            assert sandbox_id == claimed

            kstack.start_service("scaler")
            await kstack.wait_ready("scaler")
            response = await create
            assert response.status_code == 201, response.text
            assert response.json()["sandboxID"] == sandbox_id
        # The abandoned claim's pod goes (never served: its daemon never got the sandbox), swept
        # by the restarted scaler after the configured 2 s, far before the default 60 s;
        # every pod left is in the pool or adopted by its sandbox's ReplicaSet; the pool full.
        await until_gone(core, ns, pool_pod.metadata.name, within=40)
        await until_settled(admin_api, ns, [sandbox_id], 1)
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


async def until_claimed(core: k8s.CoreV1Api, ns: str, name: str) -> str:
    """The sandbox that claimed pool pod ``name`` (its claim annotation), once it has one."""
    for _ in range(600):
        pod = await core.read_namespaced_pod(name, ns)
        claimer = (pod.metadata.annotations or {}).get(ANNOTATION_CLAIMED)
        if claimer:
            return str(claimer)
        await asyncio.sleep(0.05)
    pytest.fail(f"pool pod {name} not claimed within 30 s")


async def until_gone(core: k8s.CoreV1Api, ns: str, name: str, *, within: float) -> None:
    """Pod ``name`` deleted (or being deleted) within ``within`` seconds."""
    for _ in range(int(within / 0.2)):
        names = {
            p.metadata.name
            for p in (await core.list_namespaced_pod(ns)).items
            if p.metadata.deletion_timestamp is None
        }
        if name not in names:
            return
        await asyncio.sleep(0.2)
    pytest.fail(f"the abandoned pool pod {name} not swept within {within:g} s")
