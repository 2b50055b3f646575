"""The shipped RBAC (deploy/rbac) is enough for the adapter, and nothing more is granted.

Applies the real manifests, mints a token for the ServiceAccount with the TokenRequest API and
runs the whole pause/resume cycle of ``KubernetesRuntime`` with exactly that token.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.aio import client as k8s
from kubernetes.aio import config as k8s_config
from kubernetes.aio.client.exceptions import ApiException

from shared.errors import RuntimeFailure
from shared.models.network import NetworkPolicy
from shared.ports.workloads import ANNOTATION_SNAPSHOT, WorkloadSpec
from shared.runtime.kubernetes import KubernetesRuntime
from tests.support.k8s.claims import wait_claim_gone
from tests.support.k8s.plugin import create_namespace, sandbox_templates
from tests.support.k8s.rig import ClusterAccess

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(180)]
RBAC_DIR = Path(__file__).resolve().parents[2] / "deploy" / "rbac"


def manifests(namespace: str) -> list[dict[str, Any]]:
    docs = []
    for path in sorted(RBAC_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            doc["metadata"]["namespace"] = namespace
            for subject in doc.get("subjects", []):
                subject["namespace"] = namespace
            docs.append(doc)
    return docs


async def apply(api: k8s.ApiClient, doc: dict[str, Any]) -> None:
    ns, kind = doc["metadata"]["namespace"], doc["kind"]
    rbac = k8s.RbacAuthorizationV1Api(api)
    if kind == "ServiceAccount":
        await k8s.CoreV1Api(api).create_namespaced_service_account(
            ns, k8s.V1ServiceAccount.model_validate(doc)
        )
    elif kind == "Role":
        await rbac.create_namespaced_role(ns, k8s.V1Role.model_validate(doc))
    elif kind == "RoleBinding":
        await rbac.create_namespaced_role_binding(ns, k8s.V1RoleBinding.model_validate(doc))
    else:
        pytest.fail(f"unexpected kind {kind} in deploy/rbac")


async def token_client(access: ClusterAccess, token: str) -> k8s.ApiClient:
    """A client that authenticates with ``token`` only (no client certificate)."""
    admin = k8s.Configuration()
    await k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(access.kubeconfig), client_configuration=admin
    )
    config = k8s.Configuration(host=admin.host)
    config.ssl_ca_cert = admin.ssl_ca_cert
    config.api_key = {"authorization": token}
    config.api_key_prefix = {"authorization": "Bearer"}
    return k8s.ApiClient(config)


@pytest.fixture
async def rbac_namespace(
    k8s_cluster: ClusterAccess, admin_api: k8s.ApiClient
) -> AsyncIterator[str]:
    name = f"torpor-rbac-{uuid.uuid4().hex[:6]}"
    await create_namespace(admin_api, name)
    for doc in manifests(name):
        await apply(admin_api, doc)
    yield name
    await k8s.CoreV1Api(admin_api).delete_namespace(name)


async def can_i(api: k8s.ApiClient, ns: str, verb: str, resource: str, group: str = "") -> bool:
    review = k8s.V1SelfSubjectAccessReview.model_validate(
        {
            "spec": {
                "resourceAttributes": {
                    "namespace": ns,
                    "verb": verb,
                    "resource": resource,
                    "group": group,
                }
            }
        }
    )
    answer = await k8s.AuthorizationV1Api(api).create_self_subject_access_review(review)
    return bool(answer.status and answer.status.allowed)


async def test_adapter_works_with_exactly_the_shipped_role(
    k8s_cluster: ClusterAccess,
    k8s_kubelet: object,
    admin_api: k8s.ApiClient,
    rbac_namespace: str,
) -> None:
    ns = rbac_namespace
    sa = next(d for d in manifests(ns) if d["kind"] == "ServiceAccount")["metadata"]["name"]
    request = k8s.AuthenticationV1TokenRequest.model_validate(
        {"spec": {"audiences": [], "expirationSeconds": 600}}
    )
    minted = await k8s.CoreV1Api(admin_api).create_namespaced_service_account_token(sa, ns, request)
    assert minted.status is not None
    assert minted.status.token
    api = await token_client(k8s_cluster, minted.status.token)
    try:
        # RBAC is served from an informer cache: wait until the binding is visible.
        for _ in range(100):
            if await can_i(api, ns, "create", "replicasets", "apps"):
                break
            await asyncio.sleep(0.05)
        runtime = KubernetesRuntime(api, namespace=ns, templates=sandbox_templates())

        # The whole cycle the scaler and snapshotter run, with nothing but the Role's rights.
        await runtime.create(WorkloadSpec(name="sbx-rbac", owner="alice"))
        first = await runtime.wait_ready("sbx-rbac", timeout=60)
        # The sandbox's data claim (files kept across a pause) was created with the Role's rights.
        core_admin = k8s.CoreV1Api(admin_api)
        claim = await core_admin.read_namespaced_persistent_volume_claim("torpor-data-sbx-rbac", ns)
        assert claim.metadata is not None
        assert claim.metadata.deletion_timestamp is None
        current = await runtime.get("sbx-rbac")
        assert current is not None
        await runtime.patch_annotations(
            "sbx-rbac", {ANNOTATION_SNAPSHOT: "e30="}, resource_version=current.resource_version
        )
        # The per-sandbox NetworkPolicy: applied on create, re-applied live, deleted with it.
        await runtime.set_network("sbx-rbac", NetworkPolicy(allow_internet=False))
        await runtime.scale("sbx-rbac", 0)
        await runtime.wait_stopped("sbx-rbac", timeout=60)
        await runtime.scale("sbx-rbac", 1)
        second = await runtime.wait_ready("sbx-rbac", timeout=60)
        assert second.pod_uid != first.pod_uid
        listed = await runtime.list()
        assert [w.name for w in listed] == ["sbx-rbac"]
        assert listed[0].annotations[ANNOTATION_SNAPSHOT] == "e30="
        await runtime.delete("sbx-rbac")
        assert await runtime.get("sbx-rbac") is None
        with pytest.raises(ApiException) as gone:
            await k8s.NetworkingV1Api(admin_api).read_namespaced_network_policy("sbx-rbac", ns)
        assert gone.value.status == 404
        assert not await can_i(api, ns, "list", "networkpolicies", "networking.k8s.io")
        # Deleted with the Role's rights; it lingers while the last pod terminates.
        await wait_claim_gone(admin_api, ns, "torpor-data-sbx-rbac")
        # Claims: get, create, delete only; volumes (cluster-scoped) not at all.
        for verb in ("get", "create", "delete"):
            assert await can_i(api, ns, verb, "persistentvolumeclaims")
        for verb in ("list", "watch", "update", "patch", "deletecollection"):
            assert not await can_i(api, ns, verb, "persistentvolumeclaims"), verb
        assert not await can_i(api, ns, "create", "persistentvolumes")
        assert not await can_i(api, "default", "get", "persistentvolumeclaims")
        # Built templates' pod templates: published, read and deleted with the Role's rights.
        built = "4c8f3a52-0d2e-4f8b-9a1e-6b7c5d3e2f10"
        pod = sandbox_templates().get("sandbox-base")
        await runtime.put_pod_template(built, pod, build_id=built)
        await runtime.put_pod_template(built, pod, build_id=built)  # a retried build replaces it
        read = await runtime.pod_template(built)  # as stored (the server adds its defaults)
        assert read["spec"]["containers"][0]["image"] == pod["spec"]["containers"][0]["image"]
        await runtime.delete_pod_template(built)
        for verb in ("list", "watch", "update", "patch", "deletecollection"):
            assert not await can_i(api, ns, verb, "podtemplates"), verb

        # Outside the Role: 403 from the API server.
        core, apps = k8s.CoreV1Api(api), k8s.AppsV1Api(api)
        with pytest.raises(ApiException) as secrets:
            await core.list_namespaced_secret(ns)
        assert secrets.value.status == 403
        deployment = k8s.V1Deployment.model_validate(
            {
                "metadata": {"name": "nope"},
                "spec": {
                    "selector": {"matchLabels": {"a": "b"}},
                    "template": {
                        "metadata": {"labels": {"a": "b"}},
                        "spec": {"containers": [{"name": "c", "image": "i"}]},
                    },
                },
            }
        )
        with pytest.raises(ApiException) as deployments:
            await apps.create_namespaced_deployment(ns, deployment)
        assert deployments.value.status == 403
        with pytest.raises(ApiException) as pods:
            await core.delete_collection_namespaced_pod(ns)
        assert pods.value.status == 403
        assert not await can_i(api, ns, "create", "pods")
        assert not await can_i(api, ns, "update", "replicasets", "apps")
        assert not await can_i(api, "default", "list", "replicasets", "apps")
        # ... and through the adapter, another namespace is a RuntimeFailure, not a leak.
        elsewhere = KubernetesRuntime(api, namespace="default", templates=sandbox_templates())
        with pytest.raises(RuntimeFailure, match="403"):
            await elsewhere.list()
    finally:
        await api.close()  # type: ignore[no-untyped-call]
