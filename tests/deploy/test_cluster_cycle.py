"""Least privilege end to end: the control-plane services run as local processes with exactly
what the shipped manifests give them — the ``torpor-control-plane`` ServiceAccount's token
(deploy/rbac, as rendered by the dev overlay) for the runtime services, and each service's own
NATS user (deploy/nats/auth.conf) — against the real kube-apiserver + controller-manager, with
the test kubelet running sandbox pods. The bus is provisioned by the provisioning Job's script.
A create -> pause -> resume -> kill cycle through the native REST API must complete, and no
service may hit a permission error on either side.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from shared.bus.server import free_ports
from shared.ports.workloads import ANNOTATION_SNAPSHOT
from tests.deploy.apiserver import Apiserver
from tests.deploy.kustomize import REPO
from tests.deploy.nats_auth import AuthNats, start_auth_nats
from tests.deploy.test_manifests import _render, configmap
from tests.support import processes
from tests.support.env import clean_env
from tests.support.k8s.kubelet import TestKubelet
from tests.support.k8s.rig import ClusterAccess

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.timeout(420)]

SERVICES = ("api", "proxy", "scheduler", "snapshotter", "scaler")
RUNTIME_SERVICES = ("snapshotter", "scaler")
NATIVE = "/api/v1/sandbox"
API_KEY = "torpor_deploytest0000000000000000000000000000000000"


def rbac_in(docs: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    out = []
    for original in docs:
        if original["kind"] in {"ServiceAccount", "Role", "RoleBinding"}:
            doc = json.loads(json.dumps(original))
            doc["metadata"]["namespace"] = namespace
            for subject in doc.get("subjects", []):
                subject["namespace"] = namespace
            out.append(doc)
    return out


def service_account_kubeconfig(api: Apiserver, access: ClusterAccess, ns: str, path: Path) -> Path:
    """A kubeconfig holding only a TokenRequest token of torpor-control-plane (no client cert)."""
    reply = api.client.post(
        f"/api/v1/namespaces/{ns}/serviceaccounts/torpor-control-plane/token",
        json={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )
    assert reply.status_code == 201, reply.text
    token = reply.json()["status"]["token"]
    admin = yaml.safe_load(Path(access.kubeconfig).read_text())
    cluster = admin["clusters"][0]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": "torpor-control-plane", "user": {"token": token}}],
                "contexts": [
                    {
                        "name": "sa",
                        "context": {
                            "cluster": cluster["name"],
                            "user": "torpor-control-plane",
                            "namespace": ns,
                        },
                    }
                ],
                "current-context": "sa",
            }
        )
    )
    path.chmod(0o600)
    return path


@contextlib.contextmanager
def services(
    env_of: dict[str, dict[str, str]], logs: Path
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, env in env_of.items():
            procs[name] = processes.spawn(["run", name], env=env, log=logs / f"{name}.log")
        yield procs
    finally:
        processes.stop(procs.values(), grace=20)


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    asyncio.run(processes.await_http(url, proc, log.stem, log=log, timeout=90))


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[AuthNats]:
    yield from start_auth_nats(tmp_path / "nats")


def test_create_pause_resume_kill_with_the_shipped_credentials(
    k8s_cluster: ClusterAccess, k8s_kubelet: TestKubelet, bus: AuthNats, tmp_path: Path
) -> None:
    docs = _render("dev")
    ns = f"torpor-d-{uuid.uuid4().hex[:6]}"
    api = Apiserver(Path(k8s_cluster.kubeconfig), tmp_path / "admin")
    try:
        _run_cycle(api, k8s_cluster, bus, docs, ns, tmp_path)
    finally:
        api.client.delete(f"/api/v1/namespaces/{ns}")
        api.close()


def _run_cycle(
    api: Apiserver,
    access: ClusterAccess,
    bus: AuthNats,
    docs: list[dict[str, Any]],
    ns: str,
    tmp: Path,
) -> None:
    # 1. The shipped RBAC, for real, in a fresh namespace; a token of its ServiceAccount.
    assert api.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, dry_run=False
    ).status in (200, 201)
    for doc in rbac_in(docs, ns):
        applied = api.apply(doc, dry_run=False)
        assert applied.status in (200, 201), applied.body
    sa_config = service_account_kubeconfig(api, access, ns, tmp / "sa.kubeconfig")

    # 2. The provisioning Job's script with the admin user: topology + bootstrap key.
    done = subprocess.run(
        [sys.executable, str(REPO / "deploy/kustomize/base/provision.py")],
        cwd=REPO,
        env={
            **os.environ,
            "PYTHONPATH": str(REPO),
            "NATS_URL": bus.url("admin"),
            "TORPOR_BUS_REPLICAS": "1",
            "TORPOR_BOOTSTRAP_USER": "alice",
            "TORPOR_BOOTSTRAP_API_KEY": API_KEY,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "bootstrap API key stored for alice" in done.stdout

    # 3. The services with the rendered configuration, their own NATS users, and (runtime
    #    services only) the ServiceAccount's kubeconfig. Only ports and paths are local.
    templates = tmp / "templates"
    templates.mkdir()
    for key, text in configmap(docs, "torpor-sandbox-templates")["data"].items():
        (templates / key).write_text(text)
    config = configmap(docs, "torpor-config")["data"]
    base = clean_env()
    ports = free_ports(len(SERVICES))
    api_port, proxy_port = ports.pop(), ports.pop()
    health: dict[str, int] = {}
    env_of: dict[str, dict[str, str]] = {}
    for name in SERVICES:
        env = {
            **base,
            **config,
            "NATS_URL": bus.url(name),
            "TORPOR_NAMESPACE": ns,
            "TORPOR_TEMPLATES_DIR": str(templates),
            "TORPOR_HOST": "127.0.0.1",
            "TORPOR_PORT": str(api_port),
            "TORPOR_PROXY_HOST": "127.0.0.1",
            "TORPOR_PROXY_PORT": str(proxy_port),
            "TORPOR_HEALTH_HOST": "127.0.0.1",
            "TORPOR_LOG_FORMAT": "json",
            "PYTHONUNBUFFERED": "1",
        }
        if name in RUNTIME_SERVICES:
            env["TORPOR_KUBECONFIG"] = str(sa_config)
        if name not in ("api", "proxy"):
            health[name] = ports.pop()
            env["TORPOR_HEALTH_PORT"] = str(health[name])
        env_of[name] = env
    logs = tmp / "logs"
    logs.mkdir()
    with services(env_of, logs) as procs:
        wait_http(f"http://127.0.0.1:{api_port}/health", procs["api"], logs / "api.log")
        wait_http(f"http://127.0.0.1:{proxy_port}/readyz", procs["proxy"], logs / "proxy.log")
        for name, port in health.items():
            wait_http(f"http://127.0.0.1:{port}/readyz", procs[name], logs / f"{name}.log")

        # 4. The cycle through the native API.
        rest = httpx.Client(
            base_url=f"http://127.0.0.1:{api_port}",
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=150,
        )
        with rest:
            created = rest.post(NATIVE, json={"name": "sbx-deploy", "timeout": 600})
            assert created.status_code == 201, created.text
            assert created.json()["state"] == "running"
            # Names are per user: the ReplicaSet is named by the sandbox id behind the name.
            sid = created.json()["sandboxId"]
            rs_url = f"/apis/apps/v1/namespaces/{ns}/replicasets/{sid}"
            assert api.client.get(rs_url).json()["spec"]["replicas"] == 1
            # Its NetworkPolicy, applied by the scaler with the shipped Role, goes with it.
            np_url = f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{sid}"
            policy = api.client.get(np_url).json()
            assert policy["spec"]["podSelector"]["matchLabels"] == {"torpor.dev/sandbox-id": sid}

            paused = rest.post(f"{NATIVE}/pause/sbx-deploy")
            assert paused.status_code == 200, paused.text
            assert paused.json()["state"] == "paused"
            rs = api.client.get(rs_url).json()
            assert rs["spec"]["replicas"] == 0
            snapshot = rs["metadata"]["annotations"][ANNOTATION_SNAPSHOT]
            assert "captured_time" in json.loads(base64.b64decode(snapshot))

            resumed = rest.post(f"{NATIVE}/resume/sbx-deploy")
            assert resumed.status_code == 200, resumed.text
            assert resumed.json()["state"] == "running"
            assert api.client.get(rs_url).json()["spec"]["replicas"] == 1

            killed = rest.delete(f"{NATIVE}/sbx-deploy")
            assert killed.status_code == 204, killed.text
            deadline = time.monotonic() + 60
            while api.client.get(rs_url).status_code != 404:
                assert time.monotonic() < deadline, "ReplicaSet not deleted"
                time.sleep(0.5)
            while api.client.get(np_url).status_code != 404:
                assert time.monotonic() < deadline, "NetworkPolicy not deleted"
                time.sleep(0.5)

    text = {name: (logs / f"{name}.log").read_text(errors="replace").lower() for name in SERVICES}
    for name, log in text.items():
        assert "permissions violation" not in log, f"{name} hit a NATS permission error"
        assert "forbidden" not in log, f"{name} hit a Kubernetes RBAC denial"
