"""A resume renders the pod template as it is *now*: an upgraded template reaches paused sandboxes.

Only ``replicas`` used to be patched, so a resumed pod came back with the ReplicaSet's
creation-time template. The sandbox's own env (user envs, access token) and labels must survive
the re-render; the template's own env must follow the new template.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.aio import client as k8s

from shared.ports.workloads import LABEL_OWNER, WorkloadSpec
from shared.runtime.kubernetes import DEFAULT_TEMPLATES, KubernetesRuntime, PodTemplates
from shared.runtime.kubernetes.objects import ANNOTATION_SANDBOX_ENV
from tests.k8s.test_runtime_kubernetes import pods_of
from tests.support.k8s.kubelet import TestKubelet
from tests.support.k8s.rig import ClusterAccess

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(180)]

TEMPLATE = "sandbox-upgradable"


def write_template(folder: Path, *, version: str, lang: str) -> None:
    """``sandbox-base`` under another name, with a version label and env that tell renders apart."""
    document: dict[str, Any] = yaml.safe_load((DEFAULT_TEMPLATES / "sandbox-base.yaml").read_text())
    document["metadata"]["name"] = TEMPLATE
    pod = document["template"]
    pod["metadata"]["labels"]["example.com/template-version"] = version
    daemon = pod["spec"]["containers"][0]
    daemon["env"] = [
        {"name": "LANG", "value": lang},
        {"name": "TEMPLATE_VERSION", "value": version},
        # The sandbox's own value for this name must win over the template's, before and after.
        {"name": "SHARED", "value": "from-template"},
    ]
    (folder / f"{TEMPLATE}.yaml").write_text(yaml.safe_dump(document))


@pytest.fixture
async def upgradable(
    tmp_path: Path, k8s_cluster: ClusterAccess, k8s_kubelet: TestKubelet, k8s_namespace: str
) -> AsyncIterator[tuple[KubernetesRuntime, Path]]:
    write_template(tmp_path, version="1", lang="C.UTF-8")
    runtime = await KubernetesRuntime.from_kubeconfig(
        Path(k8s_cluster.kubeconfig),
        namespace=k8s_namespace,
        templates=PodTemplates(tmp_path, DEFAULT_TEMPLATES),
    )
    yield runtime, tmp_path
    await runtime.close()


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


async def test_resume_uses_the_current_template_and_keeps_the_sandbox_env(
    upgradable: tuple[KubernetesRuntime, Path], admin_api: k8s.ApiClient
) -> None:
    rt, folder = upgradable
    name = "sbx-rerender"
    spec = WorkloadSpec(
        name=name,
        owner="alice",
        template=TEMPLATE,
        envs={"USER_SECRET": "kept", "SHARED": "from-sandbox"},
        access_token="tok-1",
    )
    await rt.create(spec)
    await rt.wait_ready(name, timeout=60)
    (first,) = await pods_of(admin_api, rt.namespace, name)
    assert env_of(first)["TEMPLATE_VERSION"] == "1"
    assert env_of(first)["SHARED"] == "from-sandbox"

    # Pause, upgrade the template on disk, resume.
    await rt.scale(name, 0)
    await rt.wait_stopped(name, timeout=60)
    write_template(folder, version="2", lang="en_US.UTF-8")
    await rt.scale(name, 1)
    second_ep = await rt.wait_ready(name, timeout=60)
    (second,) = await pods_of(admin_api, rt.namespace, name)
    assert second["metadata"]["uid"] == second_ep.pod_uid != first["metadata"]["uid"]
    env = env_of(second)
    assert env["TEMPLATE_VERSION"] == "2"
    assert env["LANG"] == "en_US.UTF-8"
    # The sandbox's own env, token and identity labels survive the re-render.
    assert env["USER_SECRET"] == "kept"
    assert env["SHARED"] == "from-sandbox"
    assert env["ENVD_ACCESS_TOKEN"] == "tok-1"
    labels = second["metadata"]["labels"]
    assert labels["example.com/template-version"] == "2"
    assert labels[LABEL_OWNER] == "alice"
    # The runtime's bookkeeping annotation stays out of the port's view and cannot be patched.
    workload = await rt.get(name)
    assert workload is not None
    assert ANNOTATION_SANDBOX_ENV not in workload.annotations
    with pytest.raises(ValueError, match="managed by the runtime"):
        await rt.patch_annotations(name, {ANNOTATION_SANDBOX_ENV: "[]"})

    # Scaling a running workload to 1 again leaves its pod alone (no re-render, no restart).
    await rt.scale(name, 1)
    (still,) = await pods_of(admin_api, rt.namespace, name)
    assert still["metadata"]["uid"] == second["metadata"]["uid"]
    await rt.delete(name)


async def test_a_template_removed_while_paused_resumes_on_the_old_one(
    upgradable: tuple[KubernetesRuntime, Path], admin_api: k8s.ApiClient
) -> None:
    rt, folder = upgradable
    name = "sbx-rerender-gone"
    await rt.create(WorkloadSpec(name=name, owner="alice", template=TEMPLATE, replicas=0))
    (folder / f"{TEMPLATE}.yaml").unlink()
    await rt.scale(name, 1)
    await rt.wait_ready(name, timeout=60)
    (pod,) = await pods_of(admin_api, rt.namespace, name)
    assert env_of(pod)["TEMPLATE_VERSION"] == "1"
    await rt.delete(name)
