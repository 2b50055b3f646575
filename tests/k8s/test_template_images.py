"""Templates users build, on the real node: OCI images in the rig's registry (issue 18).

The rig runs an OCI registry on 127.0.0.1 (tests/k8s/registry.py); the node's containerd pulls
from it over plain HTTP. Pods here run images by digest from that registry, through pod
templates that are PodTemplate objects in the sandboxes' namespace (what the builder publishes).
"""

from __future__ import annotations

import httpx
import pytest

from shared.ports.workloads import WorkloadSpec
from shared.runtime.kubernetes import DEFAULT_TEMPLATES, KubernetesRuntime, PodTemplates
from tests.conftest import skip_or_fail
from tests.k8s.realnode import RealNodeAccess
from tests.k8s.registry import push_archive
from tests.k8s.test_realnode import run_in_pod
from tests.k8s.test_runtime_kubernetes import pods_of

pytestmark = [pytest.mark.k8s, pytest.mark.realnode, pytest.mark.timeout(1200)]

BASE_REPOSITORY = "torpor/sandbox-base"
TOKEN = "img-t0ken"


@pytest.fixture(scope="module")
def base_image(real_node: RealNodeAccess) -> str:
    """sandbox-base pushed into the rig's registry: its reference by digest."""
    if not real_node.registry:
        skip_or_fail("the rig has no registry (scripts/build-registry.sh)")
        return ""
    digest = push_archive(
        real_node.image_archives["sandbox-base"], real_node.registry, BASE_REPOSITORY, "base"
    )
    return f"{real_node.registry}/{BASE_REPOSITORY}@{digest}"


async def test_a_pod_runs_an_image_pulled_from_the_rigs_registry(
    real_node: RealNodeAccess, real_runtime: KubernetesRuntime, base_image: str
) -> None:
    from tests.k8s.plugin import admin_client

    # the registry answers the distribution API and lists the pushed tag
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        listed = await client.get(f"http://{real_node.registry}/v2/{BASE_REPOSITORY}/tags/list")
    assert listed.json()["tags"] == ["base"]

    template = PodTemplates(DEFAULT_TEMPLATES).get("sandbox-base")
    container = template["spec"]["containers"][0]
    container["image"] = base_image
    container["imagePullPolicy"] = "Always"  # from the registry, not the imported copy
    name = "0f6b7c2e-1d1c-4a8e-9a57-3b1d2f0e9c11"  # a build id names a built template
    await real_runtime.put_pod_template(name, template, build_id=name)
    # not a template of the operator's files: the runtime finds the object
    assert (await real_runtime.pod_template(name))["spec"]["containers"][0]["image"] == base_image

    await real_runtime.create(
        WorkloadSpec(name="sbx-reg", template=name, owner="alice", access_token=TOKEN)
    )
    endpoint = await real_runtime.wait_ready("sbx-reg", timeout=240)
    api = await admin_client(real_node.cluster)
    try:
        (pod,) = await pods_of(api, real_runtime.namespace, "sbx-reg")
    finally:
        await api.close()  # type: ignore[no-untyped-call]
    status = pod["status"]["containerStatuses"][0]
    digest = base_image.rpartition("@")[2]
    assert status["imageID"].endswith(digest), status
    assert pod["spec"]["containers"][0]["image"] == base_image
    out, code = await run_in_pod(endpoint, ["/bin/sh", "-c", "id -u"], token=TOKEN)
    assert (out.strip(), code) == ("1000", 0)
    await real_runtime.delete("sbx-reg")
    await real_runtime.delete_pod_template(name)
