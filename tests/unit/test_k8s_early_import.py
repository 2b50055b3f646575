"""A warm resume's early import of kept files (shared/runtime/kubernetes/file_keeping.py): the
import started at the claim is the one ``wait_ready`` awaits; one that failed is done again as
usual; one into a pod that is not served is stopped; it never stands for another pod's."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes.aio import client as k8s

from shared.errors import RuntimeFailure
from shared.ports.kept_files import KeptKey
from shared.ports.workloads import Endpoint
from shared.runtime.kubernetes.objects import ANNOTATION_PERSIST, DATA_VOLUME
from shared.runtime.kubernetes.runtime import KubernetesRuntime

pytestmark = pytest.mark.unit

SID = "iearlyimport0000000a"


def template(persist: str) -> dict[str, Any]:
    return {
        "metadata": {"annotations": {ANNOTATION_PERSIST: persist}},
        "spec": {
            "containers": [{"name": "envd", "image": "i"}],
            "volumes": [{"name": DATA_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}}],
        },
    }


class Mover:
    """Stands for the KeptFilesMover: records the imports; ``fail`` first ones raise,
    ``gate`` holds them until set."""

    def __init__(self, *, fail: int = 0, gate: asyncio.Event | None = None) -> None:
        self.started: list[tuple[str, str, str, int]] = []
        self.done: list[str] = []
        self._fail = fail
        self._gate = gate

    async def restore(self, endpoint: Endpoint, token: str, key: KeptKey, *, limit: int) -> bool:
        self.started.append((endpoint.pod_uid, token, key.ident, limit))
        if self._gate is not None:
            await self._gate.wait()
        if self._fail > 0:
            self._fail -= 1
            msg = "the store is down"
            raise RuntimeFailure(msg)
        self.done.append(endpoint.pod_uid)
        return True

    async def close(self) -> None:
        return None


class Runtime(KubernetesRuntime):
    """The store parts as the ReplicaSet would give them (no API server here)."""

    async def _store_parts(self, name: str) -> Any:
        return self._kept, "token-from-the-replicaset", 1024


async def runtime(mover: Mover) -> Runtime:
    rt = Runtime(k8s.ApiClient(), namespace="torpor-sandboxes")
    rt._kept = mover  # type: ignore[assignment]
    return rt


def pod(uid: str) -> Endpoint:
    return Endpoint(host="127.0.0.9", pod_uid=uid)


async def test_the_early_import_is_the_one_wait_ready_awaits() -> None:
    mover = Mover()
    rt = await runtime(mover)
    try:
        rt._import_early(SID, pod("warm"), "sandbox-token", template("store"))
        await rt._restore_kept(SID, pod("warm"))
        assert mover.started == [("warm", "sandbox-token", SID, 1024 * 1024)]
        assert mover.done == ["warm"]
        assert rt._imports == {}
    finally:
        await rt.close()


async def test_a_failed_early_import_is_done_again() -> None:
    mover = Mover(fail=1)
    rt = await runtime(mover)
    try:
        rt._import_early(SID, pod("warm"), "sandbox-token", template("store"))
        await rt._restore_kept(SID, pod("warm"))
        assert [s[1] for s in mover.started] == ["sandbox-token", "token-from-the-replicaset"]
        assert mover.done == ["warm"]
    finally:
        await rt.close()


async def test_only_a_store_template_imports_early() -> None:
    mover = Mover()
    rt = await runtime(mover)
    try:
        for persist in ("none", "layer"):
            rt._import_early(SID, pod("warm"), "sandbox-token", template(persist))
        assert rt._imports == {}
        assert mover.started == []
    finally:
        await rt.close()


async def test_an_import_into_a_pod_not_served_is_stopped() -> None:
    gate = asyncio.Event()
    mover = Mover(gate=gate)
    rt = await runtime(mover)
    try:
        rt._import_early(SID, pod("warm"), "sandbox-token", template("store"))
        await asyncio.sleep(0)  # it has started
        await rt._forget_import("warm")
        gate.set()
        await asyncio.sleep(0)
        assert rt._imports == {}
        assert mover.done == []
    finally:
        await rt.close()


async def test_another_pods_early_import_never_stands_for_this_one() -> None:
    gate = asyncio.Event()
    mover = Mover(gate=gate)
    rt = await runtime(mover)
    try:
        rt._import_early(SID, pod("warm"), "sandbox-token", template("store"))
        gate.set()
        await rt._restore_kept(SID, pod("cold"))  # the pod served is another one
        assert "cold" in mover.done
    finally:
        await rt.close()


@pytest.mark.parametrize("name", ["--ro-bind", "i\x00x", "../isandbox", "x" * 300])
async def test_a_hostile_name_starts_no_import(name: str) -> None:
    mover = Mover()
    rt = await runtime(mover)
    try:
        with pytest.raises(ValueError, match="invalid sandbox id"):
            rt._import_early(name, pod("warm"), "sandbox-token", template("store"))
        assert rt._imports == {}
        assert mover.started == []
    finally:
        await rt.close()
