"""The real node (kubelet + containerd + runc + CNI bridge) running sandbox-base pods.

The sandbox template is ``deploy/sandbox-base`` unchanged: its image name is the
``sandbox-base`` image built here by ``scripts/build-images.sh`` and tagged in the rig's
containerd. Pods are real containers; their addresses come from the rig's bridge /24.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import struct
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes.aio import client as k8s

from shared.ports.workloads import Endpoint, WorkloadSpec
from shared.runtime.kubernetes import DEFAULT_TEMPLATES, KubernetesRuntime, PodTemplates
from tests.contract.harness import healthy
from tests.k8s.test_runtime_kubernetes import pods_of
from tests.support.k8s.realnode import RealNodeAccess

# 1200 s: the first test also pays for the session fixture, which rebuilds the images when
# their inputs changed (scripts/build-images.sh, minutes) and starts the node (about a minute)
pytestmark = [pytest.mark.k8s, pytest.mark.realnode, pytest.mark.timeout(1200)]

TOKEN = "rn-t0ken"


async def run_in_pod(endpoint: Endpoint, argv: list[str], *, token: str = TOKEN) -> tuple[str, int]:
    """Run ``argv`` through the pod's daemon (Connect stream); its stdout and exit code."""
    body = json.dumps(
        {"process": {"cmd": argv[0], "args": argv[1:], "cwd": "/workspace"}, "stdin": False}
    ).encode()
    headers = {
        "Content-Type": "application/connect+json",
        "Connect-Protocol-Version": "1",
        "X-Access-Token": token,
    }
    out, code = [], -1
    async with (
        httpx.AsyncClient(trust_env=False, timeout=60) as client,
        client.stream(
            "POST",
            f"{endpoint.base_url}/process.Process/Start",
            content=struct.pack(">BI", 0, len(body)) + body,
            headers=headers,
        ) as response,
    ):
        assert response.status_code == 200, await response.aread()
        buffer = b""
        async for chunk in response.aiter_bytes():
            buffer += chunk
            while len(buffer) >= 5:
                flags, size = struct.unpack(">BI", buffer[:5])
                if len(buffer) < 5 + size:
                    break
                message: dict[str, Any] = json.loads(buffer[5 : 5 + size] or b"{}")
                buffer = buffer[5 + size :]
                if flags & 0x02:  # end of stream
                    return "".join(out), code
                event = message.get("event", {})
                if data := event.get("data", {}).get("stdout"):
                    out.append(base64.b64decode(data).decode())
                if "end" in event:
                    code = int(event["end"].get("exitCode", 0))
    return "".join(out), code


async def test_node_is_a_real_kubelet_on_containerd(
    real_node: RealNodeAccess, real_runtime: KubernetesRuntime
) -> None:
    from tests.support.k8s.plugin import admin_client

    api = await admin_client(real_node.cluster)
    try:
        node = await k8s.CoreV1Api(api).read_node(real_node.node_name)
    finally:
        await api.close()  # type: ignore[no-untyped-call]
    info = node.status.node_info
    assert info.container_runtime_version.startswith("containerd://1.")
    assert info.kubelet_version == "v1.36.3"
    ready = {c.type: c.status for c in node.status.conditions}
    assert ready["Ready"] == "True"
    # the node's address is the gateway of the rig's own bridge (a private /24 the rig made)
    (internal,) = [a.address for a in node.status.addresses if a.type == "InternalIP"]
    assert internal == str(next(real_node.pod_cidr.hosts()))


async def test_sandbox_pod_is_a_container_paused_gone_and_resumed(
    real_node: RealNodeAccess, real_runtime: KubernetesRuntime
) -> None:
    from tests.support.k8s.plugin import admin_client

    rt, name = real_runtime, "sbx-real"
    await rt.create(WorkloadSpec(name=name, owner="alice", access_token=TOKEN))
    first = await rt.wait_ready(name, timeout=180)
    assert ipaddress.ip_address(first.host) in real_node.pod_cidr
    assert first.port == 49983
    assert await healthy(first)

    api = await admin_client(real_node.cluster)
    try:
        (pod,) = await pods_of(api, rt.namespace, name)
        status = pod["status"]["containerStatuses"][0]
        assert status["image"].endswith("sandbox-base:latest")
        assert status["containerID"].startswith("containerd://")
        container_id = status["containerID"].removeprefix("containerd://")
        assert container_id in ctr(real_node, "tasks", "ls", "-q").split()

        # the daemon runs as the image's user 1000 with no capabilities, in the pod's own netns
        out, code = await run_in_pod(
            first, ["/bin/sh", "-c", "id -u; grep CapEff /proc/self/status; cat /proc/net/route"]
        )
        assert code == 0
        lines = out.splitlines()
        assert lines[0] == "1000"
        assert lines[1].split()[1] == "0000000000000000"
        # no default route: a sandbox on this node reaches only its bridge, nothing outside
        routes = [line.split() for line in lines[3:] if line.strip()]
        assert routes, out
        assert all(r[1] != "00000000" for r in routes), out

        # pause: scale to 0; the pod and its container are gone
        await rt.scale(name, 0)
        await rt.wait_stopped(name, timeout=120)
        assert await pods_of(api, rt.namespace, name) == []
        assert container_id not in ctr(real_node, "tasks", "ls", "-q").split()
        assert not await healthy(first)

        # resume: a new pod (new uid, new container) from the same image
        await rt.scale(name, 1)
        second = await rt.wait_ready(name, timeout=180)
        assert second.pod_uid != first.pod_uid
        assert ipaddress.ip_address(second.host) in real_node.pod_cidr
        assert await healthy(second)
    finally:
        await api.close()  # type: ignore[no-untyped-call]
    await rt.delete(name)


async def test_a_sandbox_cannot_reach_the_rig_or_another_tenant_token(
    real_node: RealNodeAccess, real_runtime: KubernetesRuntime
) -> None:
    """From inside: the host's loopback control plane is not there (127.0.0.1 is the pod
    itself); the apiserver, which pods reach on the node's address as in any cluster, refuses
    a sandbox (no token is mounted, anonymous requests get 401); another token is refused by
    the daemon."""
    rt, name = real_runtime, "sbx-real-probe"
    await rt.create(WorkloadSpec(name=name, owner="bob", access_token=TOKEN))
    ep = await rt.wait_ready(name, timeout=180)
    server_port = real_node.cluster.server.rsplit(":", 1)[1]
    gateway = str(next(real_node.pod_cidr.hosts()))
    kubernetes = str(next(real_node.service_cidr.hosts()))
    probe = (
        "import os,socket,ssl,sys,urllib.request,urllib.error\n"
        "s=socket.socket(); s.settimeout(2)\n"
        "try: s.connect(('127.0.0.1',int(sys.argv[1]))); print('loopback open')\n"
        "except OSError as e: print('loopback closed',type(e).__name__)\n"
        "print('token', os.path.exists('/var/run/secrets/kubernetes.io/serviceaccount'))\n"
        "ctx=ssl.create_default_context(); ctx.check_hostname=False; ctx.verify_mode=ssl.CERT_NONE\n"
        "for url in sys.argv[2:]:\n"
        "    try: print(url, urllib.request.urlopen(url,timeout=5,context=ctx).status)\n"
        "    except urllib.error.HTTPError as e: print(url, e.code)\n"
    )
    secrets = "/api/v1/namespaces/default/secrets"
    out, code = await run_in_pod(
        ep,
        [
            "/usr/bin/python3",
            "-c",
            probe,
            server_port,
            f"https://{gateway}:{server_port}{secrets}",
            f"https://{kubernetes}{secrets}",
        ],
    )
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("loopback closed"), out
    assert lines[1] == "token False", out
    assert [line.rsplit(" ", 1)[1] for line in lines[2:]] == ["401", "401"], out
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        refused = await client.post(
            f"{ep.base_url}/process.Process/List",
            content=b"{}",
            headers={"Content-Type": "application/json", "X-Access-Token": "other-tenant"},
        )
    assert refused.status_code in (401, 403)
    await rt.delete(name)


def ctr(node: RealNodeAccess, *args: str) -> str:
    return subprocess.run(
        ["ctr", "--address", str(node.containerd_socket), "--namespace", "k8s.io", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


async def test_resume_runs_the_upgraded_template_image(
    real_node: RealNodeAccess, real_namespace: str, tmp_path: Path
) -> None:
    """An upgraded sandbox-base reaches a paused sandbox when it resumes: the new pod runs the
    template's new image reference (a second tag of the built image here) and env, and the
    sandbox's own env is kept."""
    from tests.k8s.test_template_rerender import TEMPLATE, env_of
    from tests.support.k8s.plugin import admin_client

    base = real_node.images["sandbox-base"]
    for version in ("1", "2"):
        ctr(
            real_node, "images", "tag", "--force", base, f"localhost/torpor/sandbox-base:v{version}"
        )

    def write(version: str) -> None:
        document: dict[str, Any] = yaml.safe_load(
            (DEFAULT_TEMPLATES / "sandbox-base.yaml").read_text()
        )
        document["metadata"]["name"] = TEMPLATE
        daemon = document["template"]["spec"]["containers"][0]
        daemon["image"] = f"localhost/torpor/sandbox-base:v{version}"
        daemon["imagePullPolicy"] = "Never"
        daemon["env"] = [{"name": "TEMPLATE_VERSION", "value": version}]
        (tmp_path / f"{TEMPLATE}.yaml").write_text(yaml.safe_dump(document))

    write("1")
    rt = await KubernetesRuntime.from_kubeconfig(
        Path(real_node.cluster.kubeconfig),
        namespace=real_namespace,
        templates=PodTemplates(tmp_path, DEFAULT_TEMPLATES),
    )
    api = await admin_client(real_node.cluster)
    name = "sbx-real-upgrade"
    try:
        spec = WorkloadSpec(
            name=name, owner="alice", template=TEMPLATE, envs={"MINE": "kept"}, access_token=TOKEN
        )
        await rt.create(spec)
        await rt.wait_ready(name, timeout=180)
        (first,) = await pods_of(api, rt.namespace, name)
        # both tags name the same image content here, so containerd reports either name in the
        # status: the pod spec says which image the kubelet was asked to run
        assert first["spec"]["containers"][0]["image"] == "localhost/torpor/sandbox-base:v1"
        assert first["status"]["containerStatuses"][0]["ready"] is True
        assert env_of(first)["TEMPLATE_VERSION"] == "1"

        await rt.scale(name, 0)
        await rt.wait_stopped(name, timeout=120)
        write("2")
        await rt.scale(name, 1)
        ep = await rt.wait_ready(name, timeout=180)
        (second,) = await pods_of(api, rt.namespace, name)
        assert second["metadata"]["uid"] != first["metadata"]["uid"]
        assert second["spec"]["containers"][0]["image"] == "localhost/torpor/sandbox-base:v2"
        assert second["status"]["containerStatuses"][0]["ready"] is True
        env = env_of(second)
        assert env["TEMPLATE_VERSION"] == "2"
        assert env["MINE"] == "kept"
        assert env["ENVD_ACCESS_TOKEN"] == TOKEN
        assert await healthy(ep)
        await rt.delete(name)
    finally:
        await api.close()  # type: ignore[no-untyped-call]
        await rt.close()
