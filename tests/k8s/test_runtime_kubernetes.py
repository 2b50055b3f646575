"""KubernetesRuntime against the real control plane: the pause/resume cycle, errors, listing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes.aio import client as k8s
from kubernetes.aio.client.exceptions import ApiException

from shared.errors import Conflict, NotFound, PodNotReady, RuntimeFailure, TorporError
from shared.ports.workloads import (
    ANNOTATION_SNAPSHOT,
    LABEL_OWNER,
    LABEL_SANDBOX_ID,
    WorkloadSpec,
)
from shared.runtime.kubernetes import KubernetesRuntime
from shared.runtime.kubernetes.errors import translate
from tests.contract.harness import healthy
from tests.support.k8s.kubelet import TestKubelet

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(180)]


async def pods_of(api: k8s.ApiClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """The sandbox's pods as plain JSON (camelCase keys, as the API sends them)."""
    listed = await k8s.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"{LABEL_SANDBOX_ID}={name}"
    )
    return [api.sanitize_for_serialization(p) for p in listed.items]  # type: ignore[no-untyped-call]


async def test_pause_resume_cycle_keeps_annotations_and_replaces_the_pod(
    k8s_runtime: KubernetesRuntime,
    k8s_kubelet: TestKubelet,
    admin_api: k8s.ApiClient,
) -> None:
    rt, name = k8s_runtime, "sbx-cycle"
    created = await rt.create(WorkloadSpec(name=name, owner="alice", access_token="t0ken"))
    assert created.labels[LABEL_SANDBOX_ID] == name
    assert created.labels[LABEL_OWNER] == "alice"
    first = await rt.wait_ready(name, timeout=60)
    assert first.host.startswith("127.0.3.")
    assert first.port == 49983
    assert await healthy(first)
    pod = (await pods_of(admin_api, rt.namespace, name))[0]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["ENVD_ACCESS_TOKEN"] == "t0ken"
    assert pod["spec"]["automountServiceAccountToken"] is False

    # pause: annotate (with the version we read), scale to 0, the old pod goes away
    current = await rt.get(name)
    assert current is not None
    assert current.pod_uid == first.pod_uid
    await rt.patch_annotations(
        name, {ANNOTATION_SNAPSHOT: "e30="}, resource_version=current.resource_version
    )
    await rt.scale(name, 0)
    paused = await rt.get(name)
    assert paused is not None
    assert paused.replicas == 0
    await rt.wait_stopped(name, timeout=60)
    assert await pods_of(admin_api, rt.namespace, name) == []
    assert not await healthy(first)
    assert first.pod_uid not in k8s_kubelet.running_ips()

    # resume: a new pod with a new uid, the annotation intact
    await rt.scale(name, 1)
    second = await rt.wait_ready(name, timeout=60)
    assert second.pod_uid != first.pod_uid
    assert await healthy(second)
    resumed = await rt.get(name)
    assert resumed is not None
    assert resumed.annotations[ANNOTATION_SNAPSHOT] == "e30="
    assert resumed.pod_uid == second.pod_uid
    assert resumed.pod_ip == second.host
    await rt.delete(name)
    assert await rt.get(name) is None
    await rt.wait_stopped(name, timeout=60)


async def test_scale_up_while_old_pod_is_terminating_waits_for_the_new_pod(
    k8s_runtime: KubernetesRuntime,
    k8s_kubelet: TestKubelet,
    admin_api: k8s.ApiClient,
) -> None:
    rt, name = k8s_runtime, "sbx-slowstop"
    await rt.create(WorkloadSpec(name=name, owner="alice"))
    old = await rt.wait_ready(name, timeout=60)
    k8s_kubelet.termination_delay = 4.0  # the old pod stays Terminating (and Ready) for 4 s
    try:
        await rt.scale(name, 0)
        # the old pod is marked for deletion but still there, still answering
        for _ in range(100):
            pods = await pods_of(admin_api, rt.namespace, name)
            if pods and pods[0]["metadata"].get("deletionTimestamp") is not None:
                break
            await asyncio.sleep(0.05)
        assert pods
        assert pods[0]["metadata"]["uid"] == old.pod_uid
        assert pods[0]["metadata"].get("deletionTimestamp") is not None
        assert await healthy(old), "the terminating pod should still be running"

        await rt.scale(name, 1)
        new = await rt.wait_ready(name, timeout=60)
        assert new.pod_uid != old.pod_uid
        assert await healthy(new)
        both = {p["metadata"]["uid"] for p in await pods_of(admin_api, rt.namespace, name)}
        assert old.pod_uid in both, "the new pod should be Ready while the old one terminates"
    finally:
        k8s_kubelet.termination_delay = 0.0
    for _ in range(200):  # the old pod finishes terminating; the new one stays current
        uids = {p["metadata"]["uid"] for p in await pods_of(admin_api, rt.namespace, name)}
        if old.pod_uid not in uids:
            break
        await asyncio.sleep(0.05)
    assert old.pod_uid not in uids
    current = await rt.get(name)
    assert current is not None
    assert current.pod_uid == new.pod_uid
    await rt.delete(name)


async def test_never_ready_pod_raises_pod_not_ready(k8s_runtime: KubernetesRuntime) -> None:
    rt, name = k8s_runtime, "sbx-never"
    await rt.create(WorkloadSpec(name=name, owner="alice", template="sandbox-never-ready"))
    with pytest.raises(PodNotReady):
        await rt.wait_ready(name, timeout=3)
    await rt.delete(name)


async def test_errors_are_translated(k8s_runtime: KubernetesRuntime) -> None:
    rt = k8s_runtime
    with pytest.raises(NotFound):
        await rt.scale("sbx-missing", 1)
    with pytest.raises(NotFound):
        await rt.patch_annotations("sbx-missing", {"a": "b"})
    with pytest.raises(NotFound):
        await rt.wait_ready("sbx-missing", timeout=1)
    with pytest.raises(NotFound):
        await rt.create(WorkloadSpec(name="sbx-x", owner="alice", template="no-such-template"))
    assert await rt.get("sbx-missing") is None
    await rt.delete("sbx-missing")  # idempotent

    created = await rt.create(WorkloadSpec(name="sbx-err", owner="alice", replicas=0))
    await rt.patch_annotations("sbx-err", {"a": "1"}, resource_version=created.resource_version)
    with pytest.raises(Conflict):
        await rt.patch_annotations("sbx-err", {"a": "2"}, resource_version=created.resource_version)
    with pytest.raises(RuntimeFailure):  # 422: an annotation key the API server refuses
        await rt.patch_annotations("sbx-err", {"not a valid/key/at all": "x"})
    await rt.delete("sbx-err")


async def test_list_filters_by_labels_and_reports_pods(k8s_runtime: KubernetesRuntime) -> None:
    rt = k8s_runtime
    await rt.create(WorkloadSpec(name="sbx-a1", owner="alice"))
    await rt.create(WorkloadSpec(name="sbx-a2", owner="alice", replicas=0))
    await rt.create(WorkloadSpec(name="sbx-b1", owner="bob", replicas=0))
    ready = await rt.wait_ready("sbx-a1", timeout=60)
    alice = {w.name: w for w in await rt.list(labels={LABEL_OWNER: "alice"})}
    assert set(alice) == {"sbx-a1", "sbx-a2"}
    assert alice["sbx-a1"].pod_uid == ready.pod_uid
    assert alice["sbx-a2"].pod_uid is None
    assert {w.name for w in await rt.list()} == {"sbx-a1", "sbx-a2", "sbx-b1"}
    for name in ("sbx-a1", "sbx-a2", "sbx-b1"):
        await rt.delete(name)


def test_torpor_errors_do_not_subclass_api_exception() -> None:
    """Callers catch torpor errors only; a leaked ApiException would slip past them."""
    for error in (NotFound, Conflict, RuntimeFailure, PodNotReady):
        assert not issubclass(error, ApiException)
    body = json.dumps({"message": 'replicasets.apps "x" not found'})
    assert isinstance(translate(ApiException(status=404, body=body), "read"), NotFound)
    assert isinstance(translate(ApiException(status=409, body=body), "patch"), Conflict)
    for status in (400, 403, 422, 500, 503):
        failure = translate(ApiException(status=status, body=body), "op")
        assert type(failure) is RuntimeFailure
        assert isinstance(failure, TorporError)
        assert str(status) in str(failure)
