"""The deploy overlay, for real: ``deploy/kustomize/overlays/dev`` applied to the real node
(kubelet + containerd + runc, kube-proxy) with the images built here.

NATS (StatefulSet + claim), the provisioning Job and the five services run as pods and become
Ready; the seed scenario runs through the deployed API and proxy (their ClusterIPs, routed by
kube-proxy) with the unmodified ``e2b`` SDK; sandboxes are real pods from ``sandbox-base``; the
runtime services act with their ServiceAccount's token (in-cluster config), whose Role allows
no more than ``deploy/rbac`` says. One deployment per module (``deployed``); the rig overlay
changes addressing only (``tests/k8s/deployed.py``).
"""

from __future__ import annotations

import ipaddress
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from shared.ports.workloads import LABEL_SANDBOX_ID
from tests.deploy.apiserver import Apiserver
from tests.k8s.deployed import (
    NAMESPACE,
    NATS_SELECTOR,
    SERVICES,
    Deployed,
    deploy,
)
from tests.support.k8s.provisioner import TestProvisioner
from tests.support.k8s.realnode import RealNodeAccess
from tests.support.waiting import until

# 1500 s: the first test also pays for the session's real node (and, on a cold CI machine, the
# image build) plus the deployment (about two minutes on a busy machine)
pytestmark = [pytest.mark.k8s, pytest.mark.realnode, pytest.mark.timeout(1500)]

CONTROL_PLANE_IMAGE = "ghcr.io/torpor-dev/control-plane:0.1.0"
RUNTIME_SERVICES = ("scaler", "snapshotter")
SA = f"system:serviceaccount:{NAMESPACE}:torpor-control-plane"
SERVER_PY = """\
import os, time, uuid
print(f"server.py started pid={os.getpid()} boot={uuid.uuid4().hex}", flush=True)
while True:
    time.sleep(3600)
"""
SEED_CMD = (
    "PYTHONPATH=/workspace/pylibs PATH=/workspace/npm/bin:$PATH python3 server.py"
    " > service.log 2>&1"
)


@pytest.fixture(scope="module")
def admin(
    real_node: RealNodeAccess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Apiserver]:
    api = Apiserver(Path(real_node.cluster.kubeconfig), tmp_path_factory.mktemp("admin"))
    yield api
    api.close()


@pytest.fixture(scope="module")
def deployed(
    real_node: RealNodeAccess, admin: Apiserver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployed]:
    import os

    on_ci = os.environ.get("CI", "").lower() == "true"
    workdir = tmp_path_factory.mktemp("deployed")
    # NATS's claim (volumeClaimTemplates): a hostPath volume of the rig, as for sandbox claims
    volumes = TestProvisioner(
        Path(real_node.cluster.kubeconfig), workdir / "nats-volume", NATS_SELECTOR
    ).start()
    try:
        yield deploy(real_node, workdir, install=on_ci, timeout=600)
    finally:
        # the namespace's pods (and the sandboxes' ReplicaSets) go with it
        admin.client.delete(f"/api/v1/namespaces/{NAMESPACE}")
        volumes.stop()
        shutil.rmtree(workdir / "nats-volume", ignore_errors=True)


def get(api: Apiserver, path: str) -> dict[str, Any]:
    reply = api.client.get(path)
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def pods(api: Apiserver, selector: str) -> list[dict[str, Any]]:
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    items: list[dict[str, Any]] = api.client.get(path, params={"labelSelector": selector}).json()[
        "items"
    ]
    return items


def running(pod: dict[str, Any]) -> bool:
    return pod["metadata"].get("deletionTimestamp") is None and all(
        s["ready"] for s in pod["status"].get("containerStatuses", [{"ready": False}])
    )


def test_the_overlay_runs_as_ready_pods_of_the_built_images(
    deployed: Deployed, admin: Apiserver, real_node: RealNodeAccess
) -> None:
    for service in SERVICES:
        live = [p for p in pods(admin, f"app.kubernetes.io/name=torpor-{service}") if running(p)]
        assert len(live) == 1, f"{service}: {live}"
        (pod,) = live
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] is True
        assert status["containerID"].startswith("containerd://")
        assert pod["spec"]["containers"][0]["image"] == CONTROL_PLANE_IMAGE
        assert ipaddress.ip_address(pod["status"]["podIP"]) in real_node.pod_cidr
        spec = pod["spec"]
        mounts = {m["mountPath"] for m in spec["containers"][0].get("volumeMounts", [])}
        token = "/var/run/secrets/kubernetes.io/serviceaccount"
        if service in RUNTIME_SERVICES:
            # in-cluster config: the ServiceAccount's projected token, no other credentials
            assert spec["serviceAccountName"] == "torpor-control-plane"
            assert token in mounts
        else:
            assert spec["automountServiceAccountToken"] is False
            assert token not in mounts
    (nats,) = pods(admin, NATS_SELECTOR)
    assert running(nats)
    claim = get(admin, f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/data-torpor-nats-0")
    assert claim["status"]["phase"] == "Bound"
    job = get(admin, f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/torpor-provision")
    assert job["status"].get("succeeded") == 1
    # the services reach NATS and the apiserver through Service addresses kube-proxy routes
    assert deployed.api_url.startswith("http://")
    assert ipaddress.ip_address(deployed.nats_ip) in real_node.service_cidr


def first_log_line(sbx: Sandbox) -> str:
    def line() -> str:
        return str(sbx.commands.run("cat service.log || true", cwd="/workspace").stdout.strip())

    return str(until(line, 60, "server.py writing its first log line", every=0.2))


def test_seed_through_the_deployed_api_and_proxy(
    deployed: Deployed, admin: Apiserver, real_node: RealNodeAccess
) -> None:
    """Create, start a process, pause (the pod is gone), resume (a new pod; the process is
    replayed), with the unmodified SDK against the deployed API and proxy."""
    opts: dict[str, Any] = {
        "api_key": deployed.api_key,
        "api_url": deployed.api_url,
        "sandbox_url": deployed.proxy_url,
    }
    sbx = Sandbox.create(
        template="sandbox-base",
        timeout=300,
        lifecycle={"on_timeout": "pause", "auto_resume": True},
        **opts,
    )
    selector = f"{LABEL_SANDBOX_ID}={sbx.sandbox_id}"
    try:
        sbx.files.write("/workspace/server.py", SERVER_PY)
        sbx.commands.run(SEED_CMD, background=True, timeout=0, cwd="/workspace")
        before = first_log_line(sbx)

        # a real container from the sandbox-base image on the node's bridge
        (first,) = pods(admin, selector)
        status = first["status"]["containerStatuses"][0]
        assert status["image"].endswith("sandbox-base:latest"), status
        assert status["containerID"].startswith("containerd://")
        assert ipaddress.ip_address(first["status"]["podIP"]) in real_node.pod_cidr

        paused = httpx.post(
            f"{deployed.api_url}/api/v1/sandbox/pause/{sbx.sandbox_id}",
            headers={"Authorization": f"Bearer {deployed.api_key}"},
            timeout=180,
        )
        assert paused.status_code == 200, paused.text
        info = sbx.get_info()
        assert info.state.value == "paused"
        until(lambda: not pods(admin, selector), 60, "the paused sandbox's pod going away")
        (replicaset,) = get(
            admin,
            f"/apis/apps/v1/namespaces/{NAMESPACE}/replicasets?labelSelector={selector}",
        )["items"]
        assert replicaset["spec"]["replicas"] == 0

        resumed = Sandbox.connect(sbx.sandbox_id, **opts)  # resumes the paused sandbox
        after = first_log_line(resumed)  # the replayed server.py's line
        (second,) = [p for p in pods(admin, selector) if running(p)]
        assert second["metadata"]["uid"] != first["metadata"]["uid"]
        boot = re.compile(r"pid=\d+ boot=(\w+)")
        old, new = boot.search(before), boot.search(after)
        assert old, before
        assert new, after
        assert old.group(1) != new.group(1)  # a new process: replayed, not the old one
        assert resumed.get_info().state.value == "running"
    finally:
        Sandbox.kill(sbx.sandbox_id, **opts)

    # Who did it: the apiserver's audit trail of the namespace's ServiceAccounts shows the
    # sandbox's ReplicaSet created and scaled with torpor-control-plane's token (the services'
    # in-cluster config), and no request of that identity refused.
    events = [json.loads(line) for line in real_node.audit_log.read_text().splitlines()]
    mine = [e for e in events if e["user"]["username"] == SA]
    assert mine, "no request with the ServiceAccount's token reached the apiserver"

    def did(verb: str, resource: str, subresource: str | None = None) -> bool:
        return any(
            e["verb"] == verb
            and e["objectRef"].get("resource") == resource
            and e["objectRef"].get("subresource") == subresource
            and e["objectRef"].get("namespace") == NAMESPACE
            and e["responseStatus"]["code"] < 300
            for e in mine
            if "objectRef" in e
        )

    assert did("create", "replicasets")
    assert did("patch", "replicasets", "scale") or did("update", "replicasets", "scale")
    assert did("watch", "pods") or did("list", "pods")
    refused = [e for e in mine if e["responseStatus"]["code"] == 403]
    assert not refused, refused[:3]


def can(admin: Apiserver, verb: str, resource: str, **extra: str) -> bool:
    """SubjectAccessReview: may the control plane's ServiceAccount do this?"""
    attributes = {"namespace": NAMESPACE, "verb": verb, "resource": resource, **extra}
    reply = admin.client.post(
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        json={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": SA,
                "groups": ["system:serviceaccounts"],
                "resourceAttributes": attributes,
            },
        },
    )
    assert reply.status_code == 201, reply.text
    return bool(reply.json()["status"].get("allowed", False))


def test_the_services_identity_is_least_privilege(deployed: Deployed, admin: Apiserver) -> None:
    """What the runtime needs is allowed; everything else is refused, also to a token of
    exactly the ServiceAccount the scaler and snapshotter run as."""
    assert can(admin, "create", "replicasets", group="apps")
    assert can(admin, "patch", "replicasets", group="apps", subresource="scale")
    assert can(admin, "watch", "pods")
    assert can(admin, "create", "persistentvolumeclaims")
    for verb, resource, extra in (
        ("create", "pods", {}),
        ("create", "pods", {"subresource": "exec"}),
        ("get", "secrets", {}),
        ("list", "persistentvolumeclaims", {}),
        ("update", "roles", {"group": "rbac.authorization.k8s.io"}),
        ("create", "serviceaccounts", {"subresource": "token"}),
        ("create", "replicasets", {"group": "apps", "namespace": "default"}),
        ("delete", "nodes", {"namespace": ""}),
        ("delete", "statefulsets", {"group": "apps"}),
        ("get", "configmaps", {}),
    ):
        assert not can(admin, verb, resource, **extra), (verb, resource, extra)

    minted = admin.client.post(
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/torpor-control-plane/token",
        json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    assert minted.status_code == 201, minted.text
    token = minted.json()["status"]["token"]
    headers = {"Authorization": f"Bearer {token}"}
    ns = f"/api/v1/namespaces/{NAMESPACE}"
    with httpx.Client(
        base_url=str(admin.client.base_url), verify=admin.ca_file, timeout=30, headers=headers
    ) as sa:
        assert sa.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/replicasets").status_code == 200
        for method, path in (
            ("GET", f"{ns}/secrets"),
            ("GET", f"{ns}/secrets/torpor-nats-auth"),
            ("GET", f"{ns}/configmaps"),
            ("POST", f"{ns}/pods"),
            ("GET", "/api/v1/namespaces/default/pods"),
            ("DELETE", f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/torpor-nats"),
            ("GET", f"{ns}/persistentvolumeclaims"),
        ):
            reply = sa.request(method, path, json={} if method == "POST" else None)
            assert reply.status_code == 403, (method, path, reply.status_code)


def test_a_sandbox_on_the_deployed_stack_reaches_no_credentials(
    deployed: Deployed, real_node: RealNodeAccess
) -> None:
    """From inside a sandbox (code run through the SDK): NATS and the apiserver are reachable
    on the pod network (the rig's CNI enforces no NetworkPolicy, like flannel), but neither
    lets it in: no ServiceAccount token is mounted, the apiserver answers 401, NATS refuses a
    client without a password."""
    opts: dict[str, Any] = {
        "api_key": deployed.api_key,
        "api_url": deployed.api_url,
        "sandbox_url": deployed.proxy_url,
    }
    kubernetes = str(next(real_node.service_cidr.hosts()))
    probe = (
        "import os,socket,ssl,urllib.request,urllib.error\n"
        "print('token', os.path.exists('/var/run/secrets/kubernetes.io/serviceaccount'))\n"
        "ctx=ssl.create_default_context(); ctx.check_hostname=False; ctx.verify_mode=ssl.CERT_NONE\n"
        f"url='https://{kubernetes}/api/v1/namespaces/{NAMESPACE}/secrets'\n"
        "try: print('apiserver', urllib.request.urlopen(url,timeout=5,context=ctx).status)\n"
        "except urllib.error.HTTPError as e: print('apiserver', e.code)\n"
        f"s=socket.create_connection(('{deployed.nats_ip}',4222),timeout=5); s.recv(4096)\n"
        's.sendall(b\'CONNECT {"verbose":false,"pedantic":false}\\r\\nPING\\r\\n\')\n'
        "print('nats', s.recv(4096).decode().strip())\n"
    )
    sbx = Sandbox.create(template="sandbox-base", timeout=120, **opts)
    try:
        sbx.files.write("/workspace/probe.py", probe)
        out = sbx.commands.run("python3 /workspace/probe.py", cwd="/workspace").stdout
    finally:
        Sandbox.kill(sbx.sandbox_id, **opts)
    lines = out.strip().splitlines()
    assert lines[0] == "token False", out
    assert lines[1] == "apiserver 401", out
    assert lines[2].startswith("nats -ERR 'Authorization Violation'"), out


def warnings_about(admin: Apiserver, name: str) -> list[str]:
    events = get(admin, f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
    return [
        f"{e['reason']}: {e.get('message', '')}"
        for e in events
        if e["involvedObject"]["name"] == name and e.get("type") == "Warning"
    ]


def service_restarts(admin: Apiserver) -> dict[str, int]:
    return {
        p["metadata"]["name"]: sum(s["restartCount"] for s in p["status"]["containerStatuses"])
        for service in SERVICES
        for p in pods(admin, f"app.kubernetes.io/name=torpor-{service}")
    }


def test_nats_goes_lame_duck_on_shutdown_and_the_stack_reconnects(
    deployed: Deployed, admin: Apiserver, real_node: RealNodeAccess
) -> None:
    """Deleting the NATS pod runs the StatefulSet's preStop (``nats-server --signal ldm=`` by
    name, with the pid file of nats.conf) in the built image: the server enters lame-duck mode
    before it stops, the StatefulSet brings it back Ready on the same claim, and the API serves
    again through the new server. Last in the module: the other tests need a steady NATS."""
    restarts = service_restarts(admin)
    (old,) = pods(admin, NATS_SELECTOR)
    name, uid = old["metadata"]["name"], old["metadata"]["uid"]
    deleted = admin.client.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    assert deleted.status_code == 200, deleted.text
    # the kubelet's log of the terminating container (gone once the pod is removed)
    logs = real_node.pod_logs / f"{NAMESPACE}_{name}_{uid}" / "nats"

    def lame_duck() -> bool:
        return any(
            "Entering lame duck mode" in log.read_text(errors="replace")
            for log in logs.glob("*.log")
        )

    try:
        until(lame_duck, 30, "'Entering lame duck mode' in the NATS pod's log", every=0.2)
    except AssertionError as e:
        raise AssertionError(f"{e}; pod warnings: {warnings_about(admin, name)}") from None

    def back() -> list[dict[str, Any]]:
        return [p for p in pods(admin, NATS_SELECTOR) if p["metadata"]["uid"] != uid and running(p)]

    # lame_duck_duration (30 s, nats.conf) + a start on the same claim
    until(back, 120, "a new Ready NATS pod")
    headers = {"Authorization": f"Bearer {deployed.api_key}"}

    def listed() -> bool:
        reply = httpx.get(f"{deployed.api_url}/v2/sandboxes", headers=headers, timeout=10)
        return reply.status_code == 200 and isinstance(reply.json(), list)

    until(listed, 60, "GET /v2/sandboxes answering 200 through the new NATS server")
    # reconnected, not restarted
    assert service_restarts(admin) == restarts
