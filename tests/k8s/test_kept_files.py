"""Files survive a pause on the kubernetes runtime: each sandbox's /home/user and /workspace live
on a PersistentVolumeClaim of its own (``torpor-data-<id>``), owned by its ReplicaSet and deleted
with it; ``torpor.dev/persist: none`` keeps the seed's fresh disk. Real apiserver and controller
manager (PV binder, garbage collector), the rig's provisioner and the test kubelet's pods."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes.aio import client as k8s

from shared.errors import ConfigError, Conflict
from shared.ports.workloads import LABEL_MANAGED_BY, LABEL_SANDBOX_ID, Endpoint, WorkloadSpec
from shared.runtime.kubernetes import DEFAULT_TEMPLATES, KubernetesRuntime, PodTemplates
from shared.runtime.kubernetes.objects import (
    ANNOTATION_PERSIST,
    check_volumes,
    claim_name,
    replica_set_body,
    uses_claim,
    with_sandbox_data,
)
from tests.support.k8s.claims import read_claim, wait_claim_gone
from tests.support.k8s.kubelet import TestKubelet
from tests.support.k8s.plugin import TEST_TEMPLATES
from tests.support.k8s.provisioner import bound_path

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(240)]
TOKEN = "kept-t0ken"


async def upload(ep: Endpoint, path: str, data: bytes) -> None:
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        r = await client.post(
            f"{ep.base_url}/files",
            params={"path": path, "username": "root"},
            content=data,
            headers={"X-Access-Token": TOKEN, "Content-Type": "application/octet-stream"},
        )
        assert r.status_code == 200, r.text


async def download(ep: Endpoint, path: str) -> bytes | None:
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        r = await client.get(
            f"{ep.base_url}/files",
            params={"path": path, "username": "root"},
            headers={"X-Access-Token": TOKEN},
        )
    if r.status_code == 404:
        return None
    assert r.status_code == 200, r.text
    return r.content


async def pause_resume(rt: KubernetesRuntime, name: str) -> Endpoint:
    await rt.scale(name, 0)
    await rt.wait_stopped(name, timeout=60)
    await rt.scale(name, 1)
    return await rt.wait_ready(name, timeout=90)


def fresh_template_dir(folder: Path) -> PodTemplates:
    """deploy/sandbox-base as ``sandbox-fresh`` with ``torpor.dev/persist: none``."""
    doc = yaml.safe_load((DEFAULT_TEMPLATES / "sandbox-base.yaml").read_text())
    doc["metadata"]["name"] = "sandbox-fresh"
    doc["template"]["metadata"].setdefault("annotations", {})[ANNOTATION_PERSIST] = "none"
    (folder / "sandbox-fresh.yaml").write_text(yaml.safe_dump(doc))
    return PodTemplates(folder, TEST_TEMPLATES, DEFAULT_TEMPLATES)


async def test_files_survive_pause_and_resume_and_kill_deletes_them(
    k8s_runtime: KubernetesRuntime, k8s_kubelet: TestKubelet, admin_api: k8s.ApiClient
) -> None:
    rt, name = k8s_runtime, "sbx-kept"
    ns = rt.namespace
    created = await rt.create(WorkloadSpec(name=name, owner="alice", access_token=TOKEN))
    first = await rt.wait_ready(name, timeout=90)
    await upload(first, "/workspace/kept.txt", b"across the pause\n")
    await upload(first, "/home/user/notes/n.txt", b"home too\n")

    claim = await read_claim(admin_api, ns, claim_name(name))
    assert claim is not None
    assert claim.metadata.labels[LABEL_SANDBOX_ID] == name
    assert claim.metadata.labels[LABEL_MANAGED_BY] == "torpor"
    rs = await k8s.AppsV1Api(admin_api).read_namespaced_replica_set(name, ns)
    assert [(r.kind, r.uid) for r in claim.metadata.owner_references] == [
        ("ReplicaSet", rs.metadata.uid)
    ]
    assert claim.spec.resources.requests["storage"] == "2Gi"  # the template's sizeLimit
    assert created.name == name

    second = await pause_resume(rt, name)
    assert second.pod_uid != first.pod_uid
    assert await download(second, "/workspace/kept.txt") == b"across the pause\n"
    assert await download(second, "/home/user/notes/n.txt") == b"home too\n"

    # The data is on the bound volume's folder, and goes with the sandbox.
    folder = await bound_path(k8s.CoreV1Api(admin_api), ns, claim_name(name))
    assert folder is not None
    assert (folder / "workspace" / "kept.txt").read_bytes() == b"across the pause\n"
    await rt.delete(name)
    await wait_claim_gone(admin_api, ns, claim_name(name))
    for _ in range(100):
        if not folder.exists():
            break
        await asyncio.sleep(0.1)
    assert not folder.exists()

    # A new sandbox with the same id (a native name re-created) starts empty.
    await rt.create(WorkloadSpec(name=name, owner="alice", access_token=TOKEN))
    again = await rt.wait_ready(name, timeout=90)
    assert await download(again, "/workspace/kept.txt") is None
    await rt.delete(name)
    await wait_claim_gone(admin_api, ns, claim_name(name))


async def test_resume_into_a_pod_started_while_the_old_one_terminates(
    k8s_runtime: KubernetesRuntime, k8s_kubelet: TestKubelet
) -> None:
    """The new pod starts while the paused one still holds the claim (as a pod that already
    exists would): it sees the files."""
    rt, name = k8s_runtime, "sbx-kept-overlap"
    await rt.create(WorkloadSpec(name=name, owner="alice", access_token=TOKEN))
    first = await rt.wait_ready(name, timeout=90)
    await upload(first, "/workspace/f.txt", b"still here")
    k8s_kubelet.termination_delay = 3.0
    try:
        await rt.scale(name, 0)
        await rt.scale(name, 1)
        second = await rt.wait_ready(name, timeout=90)
    finally:
        k8s_kubelet.termination_delay = 0.0
    assert second.pod_uid != first.pod_uid
    assert await download(second, "/workspace/f.txt") == b"still here"
    await rt.delete(name)


async def test_persist_none_gives_a_fresh_disk_and_no_claim(
    k8s_cluster: Any,
    k8s_kubelet: TestKubelet,
    k8s_namespace: str,
    admin_api: k8s.ApiClient,
    tmp_path: Path,
) -> None:
    rt = await KubernetesRuntime.from_kubeconfig(
        Path(k8s_cluster.kubeconfig),
        namespace=k8s_namespace,
        templates=fresh_template_dir(tmp_path),
    )
    try:
        name = "sbx-fresh"
        await rt.create(
            WorkloadSpec(name=name, owner="alice", template="sandbox-fresh", access_token=TOKEN)
        )
        first = await rt.wait_ready(name, timeout=90)
        await upload(first, "/workspace/gone.txt", b"x")
        assert await download(first, "/workspace/gone.txt") == b"x"
        assert await read_claim(admin_api, k8s_namespace, claim_name(name)) is None
        second = await pause_resume(rt, name)
        assert await download(second, "/workspace/gone.txt") is None
        await rt.delete(name)
    finally:
        await rt.close()


async def test_a_foreign_claim_of_that_name_is_never_mounted(
    k8s_runtime: KubernetesRuntime, k8s_kubelet: TestKubelet, admin_api: k8s.ApiClient
) -> None:
    """Someone else's PVC named like a sandbox's claim: create refuses it (Conflict), and
    neither create nor delete touches it."""
    rt, name = k8s_runtime, "sbx-squat"
    body = k8s.V1PersistentVolumeClaim.model_validate(
        {
            "metadata": {"name": claim_name(name), "labels": {"app": "not-torpor"}},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                "storageClassName": "none-such",
            },
        }
    )
    core = k8s.CoreV1Api(admin_api)
    await core.create_namespaced_persistent_volume_claim(rt.namespace, body)
    with pytest.raises(Conflict, match="not torpor's"):
        await rt.create(WorkloadSpec(name=name, owner="mallory", access_token=TOKEN))
    still = await read_claim(admin_api, rt.namespace, claim_name(name))
    assert still is not None
    assert still.metadata.deletion_timestamp is None
    await rt.delete(name)
    kept = await read_claim(admin_api, rt.namespace, claim_name(name))
    assert kept is not None
    assert kept.metadata.deletion_timestamp is None
    assert kept.metadata.uid == still.metadata.uid
    await core.delete_namespaced_persistent_volume_claim(claim_name(name), rt.namespace)


# ---- the rules, without a cluster ----------------------------------------------------------


@pytest.mark.parametrize(
    "hostile",
    ["", "../victim", "a/b", "a\x00b", "--ro-bind", "A", "x" * 64, "sbx.dot", "-lead", "tail-"],
)
def test_claim_names_come_only_from_valid_sandbox_ids(hostile: str) -> None:
    with pytest.raises(ValueError, match="invalid sandbox id"):
        claim_name(hostile)


def test_request_labels_cannot_pick_another_sandboxs_claim() -> None:
    template = PodTemplates(DEFAULT_TEMPLATES).get("sandbox-base")
    spec = WorkloadSpec(
        name="sbx-mine",
        owner="mallory",
        labels={LABEL_SANDBOX_ID: "sbx-victim"},
        envs={"TORPOR_SANDBOX_ID": "sbx-victim"},
    )
    pod = replica_set_body(spec, template)["spec"]["template"]
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == ["torpor-data-sbx-mine"]
    assert pod["metadata"]["labels"][LABEL_SANDBOX_ID] == "sbx-mine"


@pytest.mark.parametrize(
    "volume",
    [
        {"name": "h", "hostPath": {"path": "/"}},
        {"name": "h", "hostPath": {"path": "/var/lib/kubelet", "type": "Directory"}},
        {"name": "c", "persistentVolumeClaim": {"claimName": "torpor-data-sbx-victim"}},
    ],
)
def test_templates_cannot_mount_host_paths_or_sandbox_claims(volume: dict[str, Any]) -> None:
    template = PodTemplates(DEFAULT_TEMPLATES).get("sandbox-base")
    template["spec"]["volumes"].append(volume)
    with pytest.raises(ConfigError):
        check_volumes(template)
    with pytest.raises(ConfigError):
        with_sandbox_data(template, "sbx-a")


def test_persist_annotation_is_validated() -> None:
    template = PodTemplates(DEFAULT_TEMPLATES).get("sandbox-base")
    template["metadata"]["annotations"] = {ANNOTATION_PERSIST: "--ro-bind"}
    with pytest.raises(ConfigError, match="persist"):
        with_sandbox_data(template, "sbx-a")
    template["metadata"]["annotations"] = {ANNOTATION_PERSIST: "none"}
    assert not uses_claim(with_sandbox_data(template, "sbx-a"))
    assert uses_claim(with_sandbox_data(PodTemplates(DEFAULT_TEMPLATES).get("sandbox-base"), "b"))
