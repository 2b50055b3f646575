"""A Kubernetes create with a warm pod (shared/runtime/kubernetes/runtime.py ``create``): the
pod is taken while the sandbox's NetworkPolicy is made, and only labelled (becomes the
sandbox's) once the policy exists; a policy that fails deletes the taken pod, never served."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes.aio import client as k8s

from shared.errors import RuntimeFailure
from shared.models.network import NetworkPolicy
from shared.ports.workloads import WorkloadSpec
from shared.runtime.kubernetes.runtime import KubernetesRuntime

pytestmark = pytest.mark.unit

TEMPLATE: dict[str, Any] = {
    "metadata": {"annotations": {"torpor.dev/persist": "none"}},
    "spec": {"containers": [{"name": "envd", "image": "i"}]},
}


class Runtime(KubernetesRuntime):
    """The create's API steps recorded, in the order they end (no API server here)."""

    def __init__(self, *, policy_fails: bool = False, take_fails: bool = False) -> None:
        super().__init__(k8s.ApiClient(), namespace="torpor-sandboxes")
        self.steps: list[str] = []
        self.policy_fails = policy_fails
        self.take_fails = take_fails

    async def pod_template(self, name: str) -> dict[str, Any]:
        return TEMPLATE

    def _serves(self, template: str, pod_template: Any) -> bool:
        return True

    async def _read(self, name: str) -> Any:
        return None

    async def _take_warm(self, template: str, **kw: Any) -> dict[str, Any] | None:
        await asyncio.sleep(0.05)  # slower than the policy: both run at once
        if self.take_fails:
            msg = "the pool pod's daemon refused /init"
            raise RuntimeFailure(msg)
        self.steps.append("take")
        return {"metadata": {"name": "pool-x", "uid": "u1"}}

    async def _apply_network_policy(self, name: str, network: NetworkPolicy) -> None:
        if self.policy_fails:
            msg = "create NetworkPolicy: 403"
            raise RuntimeFailure(msg)
        self.steps.append("policy")

    async def _delete_pod(self, pod: dict[str, Any], *, as_seen: bool = False) -> None:
        self.steps.append(f"delete {pod['metadata']['name']}")

    async def _adopt(self, pod: dict[str, Any], labels: dict[str, str], *, claimer: str) -> None:
        self.steps.append("label")
        msg = "stop here: the ReplicaSet is not this test's"
        raise RuntimeFailure(msg)


SPEC = WorkloadSpec(name="sbx-order", owner="alice", template="t", access_token="tok")


async def test_the_pod_is_labelled_only_after_the_policy_exists() -> None:
    rt = Runtime()
    try:
        with pytest.raises(RuntimeFailure, match="stop here"):
            await rt.create(SPEC)
        assert rt.steps == ["policy", "take", "label"]
    finally:
        await rt.close()


async def test_a_failed_policy_deletes_the_taken_pod_and_labels_nothing() -> None:
    rt = Runtime(policy_fails=True)
    try:
        with pytest.raises(RuntimeFailure, match="NetworkPolicy"):
            await rt.create(SPEC)
        assert rt.steps == ["take", "delete pool-x"]
    finally:
        await rt.close()


async def test_a_failed_take_fails_the_create_before_any_label() -> None:
    rt = Runtime(take_fails=True)
    try:
        with pytest.raises(RuntimeFailure, match="refused /init"):
            await rt.create(SPEC)
        assert "label" not in rt.steps
    finally:
        await rt.close()
