"""Fixtures of the Kubernetes tests.

``k8s_cluster``, ``k8s_kubelet``, ``k8s_namespace`` and ``k8s_runtime`` live in
``tests/support/k8s/plugin.py`` (registered by ``tests/conftest.py``) so other folders, such as the
runtime contract suite, can use the same control plane.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from kubernetes.aio import client as k8s

from tests.support.k8s.plugin import admin_client
from tests.support.k8s.rig import ClusterAccess


@pytest.fixture
async def admin_api(k8s_cluster: ClusterAccess) -> AsyncIterator[k8s.ApiClient]:
    """An API client with the cluster-admin test credentials (system:masters)."""
    api = await admin_client(k8s_cluster)
    yield api
    await api.close()  # type: ignore[no-untyped-call]
