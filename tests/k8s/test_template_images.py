"""Templates users build, on the real node: OCI images in the rig's registry (issue 18).

The rig runs an OCI registry on 127.0.0.1 (tests/support/k8s/registry.py); the node's containerd pulls
from it over plain HTTP. Pods here run images by digest from that registry, through pod
templates that are PodTemplate objects in the sandboxes' namespace (what the builder publishes).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox, Template
from e2b.exceptions import BuildException

from shared.ports.workloads import WorkloadSpec
from shared.runtime.kubernetes import DEFAULT_TEMPLATES, KubernetesRuntime, PodTemplates
from tests.conftest import skip_or_fail
from tests.k8s.test_realnode import run_in_pod
from tests.k8s.test_runtime_kubernetes import pods_of
from tests.support.k8s.realnode import RealNodeAccess
from tests.support.k8s.registry import push_archive
from tests.support.stack import SERVICES, Stack

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
    from tests.support.k8s.plugin import admin_client

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


# ---- the builder on the real node: the unmodified SDK's Template API ---------------------------

PREFIX = "tpl"  # the registry path the builder pushes under (TORPOR_BUILDER_REGISTRY=<host>/tpl)


@pytest.fixture(scope="module")
def kstack(
    real_node: RealNodeAccess, base_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The services as host processes on the Kubernetes runtime of the real node, with the
    builder pushing to the rig's registry (build pods offline: the network rule)."""
    from tests.support.fixtures import started
    from tests.support.k8s.plugin import admin_client, create_namespace, delete_namespace

    namespace = f"torpor-img-{uuid.uuid4().hex[:8]}"

    async def namespaced(make: bool) -> None:
        api = await admin_client(real_node.cluster)
        try:
            await (create_namespace(api, namespace) if make else delete_namespace(api, namespace))
        finally:
            await api.close()  # type: ignore[no-untyped-call]

    asyncio.run(namespaced(True))
    try:
        yield from started(
            Stack(
                tmp_path_factory.mktemp("kstack"),
                services=(*SERVICES, "builder"),
                runtime="kubernetes",
                env={
                    "TORPOR_KUBECONFIG": str(real_node.cluster.kubeconfig),
                    "TORPOR_NAMESPACE": namespace,
                    "TORPOR_SCALER_READY_TIMEOUT": "180",
                    "TORPOR_BUILDER_REGISTRY": f"{real_node.registry}/{PREFIX}",
                    "TORPOR_BUILDER_REGISTRY_INSECURE": "true",
                    "TORPOR_BUILDER_BASE_IMAGE": base_image.removeprefix(real_node.registry + "/"),
                    "TORPOR_BUILDER_ALLOW_INTERNET": "false",
                    "TORPOR_TUNING": "BUILDER_POD_READY_TIMEOUT=240",
                    "TORPOR_BUILDER_DISK": "2Gi",
                },
            )
        )
    finally:
        asyncio.run(namespaced(False))


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ctx = tmp_path_factory.mktemp("context")
    (ctx / "app").mkdir()
    (ctx / "app" / "config.txt").write_text("copied into the image\n")
    return ctx


def _probe(real_node: RealNodeAccess) -> str:
    """Shell that tries the rig's registry from inside the build pod: on the node's address
    (where the apiserver listens) and on the pod's own loopback, at the registry's port."""
    port = real_node.registry.rpartition(":")[2]
    node_ip = str(next(real_node.pod_cidr.hosts()))
    return (
        f"for h in {node_ip} 127.0.0.1; do "
        f"if timeout 5 bash -c 'echo > /dev/tcp/'$h'/{port}' 2>/dev/null; "
        "then echo reached $h; else echo blocked $h; fi; done > /home/user/probe.txt; "
        "ls /var/run/secrets/kubernetes.io 2>&1 | head -1 >> /home/user/probe.txt; "
        "env | grep -c -i registry >> /home/user/probe.txt || true"
    )


def _template(context: Path, marker: str, probe: str) -> Any:
    return (
        Template(file_context_path=str(context))
        .from_debian_image()
        .copy("app/config.txt", "/home/user/app/config.txt")
        .run_cmd(
            "rm /etc/issue && mkdir -p /opt/made && echo root-made > /opt/made/by-root", user="root"
        )
        .run_cmd(f"echo {marker} > /home/user/marker.txt; {probe}")
        .set_start_cmd(
            "echo started > /tmp/started.txt && sleep infinity", "test -f /tmp/started.txt"
        )
    )


@pytest.fixture(scope="module")
def built(kstack: Stack, context: Path, real_node: RealNodeAccess) -> dict[str, Any]:
    name = f"img-{uuid.uuid4().hex[:8]}"
    logs: list[str] = []
    info = Template.build(
        _template(context, "one", _probe(real_node)),
        name,
        on_build_logs=lambda e: logs.append(e.message),
        api_key=kstack.keys["alice"],
        api_url=kstack.api_url,
    )
    return {"name": name, "info": info, "logs": logs}


async def test_a_built_template_is_an_image_in_the_registry_that_sandboxes_run(
    kstack: Stack, built: dict[str, Any], real_node: RealNodeAccess
) -> None:
    from tests.support.k8s.plugin import admin_client

    info = built["info"]
    repo = f"{PREFIX}/templates/{info.template_id}"
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        tags = (await client.get(f"http://{real_node.registry}/v2/{repo}/tags/list")).json()
        assert info.build_id in tags["tags"]
        manifest = await client.get(
            f"http://{real_node.registry}/v2/{repo}/manifests/{info.build_id}",
            headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
        )
    assert manifest.status_code == 200
    digest = manifest.headers["docker-content-digest"]
    image = f"{real_node.registry}/{repo}@{digest}"

    sbx = await asyncio.to_thread(Sandbox.create, built["name"], **kstack.sdk_opts("alice"))
    try:
        api = await admin_client(real_node.cluster)
        try:
            namespace = kstack.env["TORPOR_NAMESPACE"]
            (pod,) = await pods_of(api, namespace, sbx.sandbox_id)
        finally:
            await api.close()  # type: ignore[no-untyped-call]
        assert pod["spec"]["containers"][0]["image"] == image
        assert pod["status"]["containerStatuses"][0]["imageID"].endswith(digest)
        out = await asyncio.to_thread(
            sbx.commands.run,
            "cat /home/user/app/config.txt /home/user/marker.txt /tmp/started.txt /opt/made/by-root;"
            " test -e /etc/issue && echo issue-still-there || echo issue-gone;"
            " stat -c %U /home/user/app/config.txt /opt/made/by-root",
        )
        assert out.stdout.split("\n")[:7] == [
            "copied into the image",
            "one",
            "started",
            "root-made",
            "issue-gone",  # the RUN step's deletion is a whiteout in its layer
            "user",
            "root",
        ], (out.stdout, out.stderr, built["logs"])
        procs = await asyncio.to_thread(sbx.commands.list)
        assert any("sleep infinity" in " ".join([p.cmd, *p.args]) for p in procs)
        # hostile: the build step reached no registry and held no credentials
        probe = await asyncio.to_thread(sbx.commands.run, "cat /home/user/probe.txt")
        lines = probe.stdout.splitlines()
        node_ip = str(next(real_node.pod_cidr.hosts()))
        assert lines[:2] == [f"blocked {node_ip}", "blocked 127.0.0.1"], lines
        assert "No such file or directory" in lines[2]  # no ServiceAccount token
        assert lines[3] == "0"  # no registry setting in its environment
    finally:
        await asyncio.to_thread(sbx.kill)


async def test_a_rebuild_with_one_change_reuses_the_cached_steps(
    kstack: Stack, built: dict[str, Any], context: Path, real_node: RealNodeAccess
) -> None:
    info = await asyncio.to_thread(
        Template.build,
        _template(context, "two", _probe(real_node)),
        built["name"],
        api_key=kstack.keys["alice"],
        api_url=kstack.api_url,
    )
    with kstack.client("alice") as c:
        status = c.get(f"/templates/{info.template_id}/builds/{info.build_id}/status").json()
    cached = [
        e["message"].split("]")[0]
        for e in status["logEntries"]
        if e["message"].startswith("CACHED")
    ]
    assert cached == ["CACHED [1/3", "CACHED [2/3"]
    sbx = await asyncio.to_thread(Sandbox.create, built["name"], **kstack.sdk_opts("alice"))
    try:
        out = await asyncio.to_thread(sbx.commands.run, "cat /home/user/marker.txt")
        assert out.stdout.strip() == "two"
        # pause and resume: the new pod is rendered from the built template's pod template
        # again (same image by digest); the sandbox's own files stay, the seed does not rerun
        await asyncio.to_thread(
            sbx.commands.run,
            "echo mine > /home/user/own.txt && echo changed > /home/user/marker.txt",
        )
        before = await _pod_image(real_node, kstack, sbx.sandbox_id)
        await asyncio.to_thread(sbx.pause)
        resumed = await asyncio.to_thread(
            Sandbox.connect, sbx.sandbox_id, **kstack.sdk_opts("alice")
        )
        out = await asyncio.to_thread(
            resumed.commands.run, "cat /home/user/own.txt /home/user/marker.txt /tmp/started.txt"
        )
        assert out.stdout.split() == ["mine", "changed", "started"]
        assert await _pod_image(real_node, kstack, sbx.sandbox_id) == before
    finally:
        await asyncio.to_thread(sbx.kill)


async def _pod_image(real_node: RealNodeAccess, kstack: Stack, sandbox_id: str) -> tuple[str, str]:
    from tests.support.k8s.plugin import admin_client

    api = await admin_client(real_node.cluster)
    try:
        (pod,) = await pods_of(api, kstack.env["TORPOR_NAMESPACE"], sandbox_id)
    finally:
        await api.close()  # type: ignore[no-untyped-call]
    return pod["spec"]["containers"][0]["image"], pod["status"]["containerStatuses"][0]["imageID"]


def test_a_failing_step_reports_its_log_and_exit_code(kstack: Stack) -> None:
    template = Template().from_debian_image().run_cmd("echo about to fail; exit 7")
    with pytest.raises(BuildException) as failed:
        Template.build(
            template,
            f"fail-{uuid.uuid4().hex[:8]}",
            api_key=kstack.keys["alice"],
            api_url=kstack.api_url,
        )
    assert "exit status 7" in str(failed.value)
