"""The kubernetes adapter under the contract suite: a real control plane and the test kubelet.

Each harness gets a fresh namespace; pods run as local daemons on 127.0.3.x (tests/k8s).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from kubernetes.aio import client as k8s
from kubernetes.aio.client.exceptions import ApiException

from shared.runtime.kubernetes import KubernetesRuntime
from tests.contract.harness import HarnessContext, RuntimeHarness
from tests.support.k8s.plugin import admin_client, create_namespace, sandbox_templates
from tests.support.k8s.rig import ClusterAccess


@asynccontextmanager
async def harness(context: HarnessContext) -> AsyncIterator[RuntimeHarness]:
    cluster: ClusterAccess = context.request.getfixturevalue("k8s_cluster")
    context.request.getfixturevalue("k8s_kubelet")
    admin = await admin_client(cluster)
    namespace = f"torpor-c-{uuid.uuid4().hex[:8]}"
    runtime: KubernetesRuntime | None = None
    try:
        await create_namespace(admin, namespace)
        runtime = await KubernetesRuntime.from_kubeconfig(
            cluster.kubeconfig, namespace=namespace, templates=sandbox_templates()
        )
        yield RuntimeHarness(
            runtime=runtime, never_ready_template="sandbox-never-ready", ready_timeout=60.0
        )
    finally:
        if runtime is not None:
            await runtime.close()
        try:
            await k8s.CoreV1Api(admin).delete_namespace(namespace)
        except ApiException as e:
            if e.status != 404:
                raise
        await admin.close()  # type: ignore[no-untyped-call]
