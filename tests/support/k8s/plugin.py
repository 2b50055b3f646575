"""Pytest plugin (listed in ``tests/conftest.py``): a real Kubernetes cluster for any test folder.

Fixtures:
- ``k8s_cluster`` (session): a ``ClusterAccess`` (kubeconfig, server) from the first available
  backend: ``TORPOR_TEST_KUBECONFIG``, the binaries of ``scripts/build-k8s.sh``, or k3s in
  Docker. On CI the local binaries are required (and built if missing).
- ``k8s_kubelet`` (session): the test kubelet running torpor pods as local daemons.
- ``k8s_namespace``: a fresh namespace, deleted afterwards.
- ``k8s_runtime``: a ``KubernetesRuntime`` on that namespace with the admin credentials.
- ``real_node`` (session): a second backend, a real kubelet + containerd node on its own control
  plane (``tests/support/k8s/realnode.py``), for tests marked ``realnode``; ``real_namespace`` and
  ``real_runtime`` are the same as above on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.k8s.realnode import RealNodeAccess, provide_real_node
from tests.support.k8s.rig import ClusterAccess, ClusterUnavailable, provide_cluster

# The Kubernetes client is imported where it is used: every pytest run loads this plugin, and
# importing it costs seconds (most of `make unit`'s start-up before this was lazy).
if TYPE_CHECKING:
    from kubernetes.aio import client as k8s

    from shared.runtime.kubernetes import KubernetesRuntime, PodTemplates
    from tests.support.k8s.kubelet import TestKubelet

ON_CI_ENV = "CI"
# Test-only templates (e.g. a pod that never becomes ready), searched before deploy/sandbox-base.
TEST_TEMPLATES = Path(__file__).resolve().parent / "templates"


def sandbox_templates() -> PodTemplates:
    from shared.runtime.kubernetes import DEFAULT_TEMPLATES, PodTemplates

    return PodTemplates(TEST_TEMPLATES, DEFAULT_TEMPLATES)


def _skip_or_fail(reason: str) -> None:
    from tests.conftest import skip_or_fail

    skip_or_fail(reason)


@pytest.fixture(scope="session")
def k8s_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterAccess]:
    import os

    on_ci = os.environ.get(ON_CI_ENV, "").lower() == "true"
    workdir = tmp_path_factory.mktemp("k8s")
    try:
        provider = provide_cluster(workdir, on_ci=on_ci)
        access = provider.__enter__()
    except ClusterUnavailable as e:
        _skip_or_fail(f"no Kubernetes control plane: {e}")
        return
    try:
        yield access
    finally:
        provider.__exit__(None, None, None)


@pytest.fixture(scope="session")
def real_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNodeAccess]:
    import os

    on_ci = os.environ.get(ON_CI_ENV, "").lower() == "true"
    # short path: containerd's socket path must stay under the unix socket limit (108 bytes)
    workdir = Path(tempfile.mkdtemp(prefix="torpor-rn-"))
    try:
        provider = provide_real_node(workdir, on_ci=on_ci)
        access = provider.__enter__()
    except ClusterUnavailable as e:
        shutil.rmtree(workdir, ignore_errors=True)
        _skip_or_fail(f"no real Kubernetes node: {e}")
        return
    # Sandbox pods mount a claim each (files kept across a pause): hostPath volumes on the node.
    from tests.support.k8s.provisioner import TestProvisioner

    volumes = TestProvisioner(Path(access.cluster.kubeconfig), workdir / "volumes").start()
    try:
        yield access
    finally:
        volumes.stop()
        provider.__exit__(None, None, None)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
async def real_namespace(real_node: RealNodeAccess) -> AsyncIterator[str]:
    async with scratch_namespace(real_node.cluster, "torpor-rn") as name:
        yield name


@pytest.fixture
async def real_runtime(
    real_node: RealNodeAccess, real_namespace: str
) -> AsyncIterator[KubernetesRuntime]:
    """The adapter with deploy/sandbox-base unchanged: its image is the one built here."""
    from shared.runtime.kubernetes import KubernetesRuntime

    runtime = await KubernetesRuntime.from_kubeconfig(
        Path(real_node.cluster.kubeconfig), namespace=real_namespace, templates=sandbox_templates()
    )
    yield runtime
    await runtime.close()


@pytest.fixture(scope="session")
def k8s_kubelet(
    k8s_cluster: ClusterAccess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestKubelet]:
    from tests.support.k8s.kubelet import TestKubelet

    kubelet = TestKubelet(
        kubeconfig=k8s_cluster.kubeconfig, workdir=tmp_path_factory.mktemp("kubelet")
    ).start()
    yield kubelet
    kubelet.stop()


async def admin_client(access: ClusterAccess | Path) -> k8s.ApiClient:
    from kubernetes.aio import config as k8s_config

    path = access.kubeconfig if isinstance(access, ClusterAccess) else access
    return await k8s_config.new_client_from_config(config_file=str(path))  # type: ignore[no-any-return,no-untyped-call]


async def create_namespace(api: k8s.ApiClient, name: str, *, timeout: float = 30.0) -> None:
    """Create ``name`` and wait for its default ServiceAccount (pods need it to be admitted)."""
    from kubernetes.aio import client as k8s
    from kubernetes.aio.client.exceptions import ApiException

    core = k8s.CoreV1Api(api)
    await core.create_namespace(
        k8s.V1Namespace.model_validate(
            {"metadata": {"name": name, "labels": {"torpor.dev/test": "true"}}}
        )
    )
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            await core.read_namespaced_service_account("default", name)
            return
        except ApiException as e:
            if e.status != 404 or asyncio.get_running_loop().time() > deadline:
                raise
        await asyncio.sleep(0.1)


async def delete_namespace(api: k8s.ApiClient, name: str) -> None:
    from kubernetes.aio import client as k8s
    from kubernetes.aio.client.exceptions import ApiException

    try:
        await k8s.CoreV1Api(api).delete_namespace(name)
    except ApiException as e:
        if e.status != 404:
            raise


@contextlib.asynccontextmanager
async def scratch_namespace(access: ClusterAccess, prefix: str) -> AsyncIterator[str]:
    """A new namespace ``<prefix>-<random>``, deleted afterwards (not when the body raises)."""
    api = await admin_client(access)
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    try:
        await create_namespace(api, name)
        yield name
        await delete_namespace(api, name)
    finally:
        await api.close()  # type: ignore[no-untyped-call]


@pytest.fixture
async def k8s_namespace(k8s_cluster: ClusterAccess) -> AsyncIterator[str]:
    async with scratch_namespace(k8s_cluster, "torpor-t") as name:
        yield name


@pytest.fixture
async def k8s_runtime(
    k8s_cluster: ClusterAccess, k8s_kubelet: TestKubelet, k8s_namespace: str
) -> AsyncIterator[KubernetesRuntime]:
    from shared.runtime.kubernetes import KubernetesRuntime

    runtime = await KubernetesRuntime.from_kubeconfig(
        Path(k8s_cluster.kubeconfig), namespace=k8s_namespace, templates=sandbox_templates()
    )
    yield runtime
    await runtime.close()
