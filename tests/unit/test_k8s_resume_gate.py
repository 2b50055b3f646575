"""A Kubernetes resume into a warm pod (shared/runtime/kubernetes/runtime.py ``scale``): the
pod template is gated while the ReplicaSet is scaled and the warm pod adopted, and the gate is
lifted before ``scale`` returns, whatever happened; when no warm pod was adopted, the pods made
while it was gated go too (a cold one starts)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.aio import client as k8s

from shared.errors import RuntimeFailure
from shared.ports.workloads import Endpoint
from shared.runtime.kubernetes.pool_claiming import WarmResume
from shared.runtime.kubernetes.runtime import KubernetesRuntime

pytestmark = pytest.mark.unit

POD: dict[str, Any] = {"metadata": {"name": "pool-x", "uid": "u1"}, "status": {"podIP": "10.0.0.9"}}


class Runtime(KubernetesRuntime):
    """The resume's API steps recorded in order (no API server here)."""

    def __init__(self, *, warm: bool = True, adopt: str = "ok") -> None:
        super().__init__(k8s.ApiClient(), namespace="torpor-sandboxes", pools={"t": 1})
        self.steps: list[str] = []
        self.warm, self.adopt = warm, adopt

    async def _warm_resume(self, name: str) -> WarmResume | None:
        if not self.warm:
            return None
        rs = {"metadata": {"uid": "rs-1"}, "spec": {"replicas": 0, "template": {}}}
        return WarmResume(rs, {}, [POD], "t", "v1", {}, "tok", {})

    async def _take_warm(self, template: str, **kw: Any) -> dict[str, Any] | None:
        self.steps.append("take")
        return POD

    def _import_early(self, name: str, endpoint: Endpoint, token: str, tpl: Any) -> None:
        pass

    async def _forget_import(self, uid: str) -> None:
        pass

    async def _rerender(self, name: str, seen: Any = None, *, gate: bool = False) -> bool:
        self.steps.append("scale gated" if gate else "scale")
        return True

    async def _adopt(self, pod: Any, labels: Any, *, claimer: str, owner_uid: Any = None) -> bool:
        self.steps.append("adopt")
        if self.adopt == "raises":
            msg = "the API server went away"
            raise RuntimeFailure(msg)
        return self.adopt == "ok"

    async def _ungate(self, name: str, *, drop_gated_pods: bool) -> None:
        self.steps.append("ungate, drop gated pods" if drop_gated_pods else "ungate")

    async def _delete_pod(self, pod: dict[str, Any], *, as_seen: bool = False) -> None:
        self.steps.append("delete warm pod")


async def steps(rt: Runtime) -> list[str]:
    try:
        try:
            await rt.scale("sbx-r", 1)
        except RuntimeFailure:
            rt.steps.append("raised")
        return rt.steps
    finally:
        await rt.close()


async def test_a_warm_resume_gates_before_the_scale_and_lifts_after_the_adoption() -> None:
    assert await steps(Runtime()) == ["take", "scale gated", "adopt", "ungate"]


async def test_a_failed_adoption_lifts_the_gate_and_drops_the_gated_pods() -> None:
    assert await steps(Runtime(adopt="failed")) == [
        "take",
        "scale gated",
        "adopt",
        "ungate, drop gated pods",
    ]
    assert await steps(Runtime(adopt="raises")) == [
        "take",
        "scale gated",
        "adopt",
        "ungate, drop gated pods",
        "raised",
    ]


async def test_a_cold_resume_is_never_gated() -> None:
    assert await steps(Runtime(warm=False)) == ["scale"]
