"""Warm pools on Kubernetes (shared/runtime/kubernetes/pools.py): a real kube-apiserver and
controller-manager (the ReplicaSet controller adopts the claimed pod), the test kubelet running
the real daemon. Templates with ``persist: none`` only (a pool pod cannot carry a sandbox's
claim)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes.aio import client as k8s

from shared.ports.workloads import Endpoint, WorkloadSpec
from shared.runtime.kubernetes import DEFAULT_TEMPLATES, KubernetesRuntime, PodTemplates
from shared.runtime.kubernetes.objects import ANNOTATION_PERSIST
from shared.runtime.kubernetes.pools import ANNOTATION_SECRET, LABEL_POOL
from tests.k8s.kubelet import TestKubelet
from tests.k8s.rig import ClusterAccess
from tests.k8s.test_runtime_kubernetes import pods_of

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(240)]

TEMPLATE = "sandbox-fresh"


@pytest.fixture
async def pooled(
    tmp_path: Path, k8s_cluster: ClusterAccess, k8s_kubelet: TestKubelet, k8s_namespace: str
) -> AsyncIterator[KubernetesRuntime]:
    document: dict[str, Any] = yaml.safe_load((DEFAULT_TEMPLATES / "sandbox-base.yaml").read_text())
    document["metadata"]["name"] = TEMPLATE
    meta = document["template"].setdefault("metadata", {})
    meta.setdefault("annotations", {})[ANNOTATION_PERSIST] = "none"
    (tmp_path / f"{TEMPLATE}.yaml").write_text(yaml.safe_dump(document))
    runtime = await KubernetesRuntime.from_kubeconfig(
        Path(k8s_cluster.kubeconfig),
        namespace=k8s_namespace,
        templates=PodTemplates(tmp_path, DEFAULT_TEMPLATES),
        pools={TEMPLATE: 1},
    )
    runtime.start_pools(interval=0.2, claim_timeout=30)
    yield runtime
    await runtime.close()


async def until_warm(rt: KubernetesRuntime) -> None:
    for _ in range(600):
        if await rt.warm_pods(TEMPLATE) >= 1:
            return
        await asyncio.sleep(0.2)
    pytest.fail("no warm pod within 120 s")


async def envs(ep: Endpoint, token: str) -> tuple[int, dict[str, str]]:
    async with httpx.AsyncClient(trust_env=False, timeout=10) as c:
        r = await c.get(f"{ep.base_url}/envs", headers={"X-Access-Token": token})
    return r.status_code, (r.json() if r.status_code == 200 else {})


async def test_create_and_resume_claim_warm_pods_adopted_by_the_replica_set(
    pooled: KubernetesRuntime, admin_api: k8s.ApiClient
) -> None:
    rt = pooled
    await until_warm(rt)
    pool_pods = [
        p
        for p in (await k8s.CoreV1Api(admin_api).list_namespaced_pod(rt.namespace)).items
        if LABEL_POOL in (p.metadata.labels or {})
    ]
    (pool_pod,) = pool_pods
    secret = pool_pod.metadata.annotations[ANNOTATION_SECRET]

    name = "sbx-warm"
    spec = WorkloadSpec(
        name=name, owner="alice", template=TEMPLATE, envs={"FOO": "bar"}, access_token="tok-w"
    )
    await rt.create(spec)
    ep = await rt.wait_ready(name, timeout=60)
    assert ep.warm and ep.pod_uid == pool_pod.metadata.uid
    (pod,) = await pods_of(admin_api, rt.namespace, name)
    assert pod["metadata"]["name"].startswith("pool-")
    assert LABEL_POOL not in pod["metadata"]["labels"]
    assert [r["kind"] for r in pod["metadata"]["ownerReferences"]] == ["ReplicaSet"]
    assert (await envs(ep, secret))[0] == 401  # the one-time token is dead
    code, values = await envs(ep, "tok-w")
    assert code == 200 and values["FOO"] == "bar" and values["E2B_SANDBOX_ID"] == name

    # Resume into a warm pod (the pool refilled meanwhile).
    await rt.scale(name, 0)
    await rt.wait_stopped(name, timeout=60)
    await until_warm(rt)
    await rt.scale(name, 1)
    again = await rt.wait_ready(name, timeout=60)
    assert again.warm and again.pod_uid != ep.pod_uid
    assert (await envs(again, "tok-w"))[1]["E2B_SANDBOX_ID"] == name

    # Concurrent creates against a pool of one: each sandbox its own pod, at most one warm, the
    # rest cold (the pool is empty right after a claim).
    await until_warm(rt)
    names = ["sbx-c1", "sbx-c2", "sbx-c3"]

    async def create(n: str) -> Endpoint:
        await rt.create(spec.model_copy(update={"name": n, "access_token": f"tok-{n}"}))
        return await rt.wait_ready(n, timeout=60)

    eps = await asyncio.gather(*(create(n) for n in names))
    assert len({e.pod_uid for e in eps}) == 3
    assert sum(e.warm for e in eps) <= 1 and not all(e.warm for e in eps)
    for n, e in zip(names, eps, strict=True):
        assert (await envs(e, f"tok-{n}"))[0] == 200
        assert len(await pods_of(admin_api, rt.namespace, n)) == 1
    for n in (name, *names):
        await rt.delete(n)
