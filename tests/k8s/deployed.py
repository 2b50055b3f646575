"""torpor deployed on the real node: ``deploy/kustomize/overlays/dev`` applied as an operator
would, with the images built here, its pods run by the real kubelet.

The rig overlay (written per rig, next to the rig's other files) takes the dev overlay as its
only resource and changes addressing only, because the rig has no cluster DNS:

- the ``torpor-nats`` Service gets a fixed ClusterIP in the rig's service /24, and every pod
  that dials ``torpor-nats`` (the five services and the provisioning Job) gets a ``hostAliases``
  entry for that name. kube-proxy routes the ClusterIP to the NATS pod, as in any cluster.

Everything else is the dev overlay unchanged: the images (``ghcr.io/torpor-dev/...`` names,
tagged onto the images of ``scripts/build-images.sh`` by the rig), the NATS StatefulSet and its
claim (bound by the rig's test provisioner), the RBAC of ``deploy/rbac`` (scaler and snapshotter
use their ServiceAccount's token through in-cluster config: ``KUBERNETES_SERVICE_HOST`` is the
``kubernetes`` Service, which kube-proxy routes to the apiserver).
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.apiserver import Apiserver
from tests.deploy.kustomize import REPO, command
from tests.support.k8s.realnode import IMAGE_ALIASES, RealNodeAccess, images_folder, read_images

NAMESPACE = "torpor"
DEV_OVERLAY = REPO / "deploy" / "kustomize" / "overlays" / "dev"
DEV_API_KEY = "torpor_devkey000000000000000000000000000000000000"  # the dev overlay's own
SERVICES = ("api", "proxy", "scheduler", "snapshotter", "scaler")
NATS_SELECTOR = "app.kubernetes.io/name=torpor-nats"


class DeployFailed(AssertionError):
    """The overlay did not come up; the message carries what the cluster said."""


@dataclass(frozen=True)
class Deployed:
    api_url: str  # http://<torpor-api ClusterIP>
    proxy_url: str  # http://<torpor-proxy ClusterIP>
    api_key: str
    nats_ip: str
    namespace: str = NAMESPACE
    took: float = 0.0

    def sdk_env(self) -> dict[str, str]:
        return {
            "E2B_API_KEY": self.api_key,
            "E2B_API_URL": self.api_url,
            "E2B_SANDBOX_URL": self.proxy_url,
        }


def nats_cluster_ip(node: RealNodeAccess) -> str:
    """A fixed address for torpor-nats: .10 of the rig's service /24 (.1 is kubernetes)."""
    return str(node.service_cidr.network_address + 10)


def write_rig_overlay(folder: Path, node: RealNodeAccess) -> Path:
    """The rig overlay: the dev overlay plus addressing (see the module docstring)."""
    nats_ip = nats_cluster_ip(node)
    aliases = [{"ip": nats_ip, "hostnames": ["torpor-nats"]}]
    alias_patch = json.dumps(
        [{"op": "add", "path": "/spec/template/spec/hostAliases", "value": aliases}]
    )
    service_patch = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "torpor-nats", "namespace": NAMESPACE},
        "spec": {"clusterIP": nats_ip},
    }
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        # kustomize takes a base by relative path only
        "resources": [os.path.relpath(DEV_OVERLAY, folder)],
        "patches": [
            {"patch": yaml.safe_dump(service_patch)},
            {"target": {"kind": "Deployment"}, "patch": alias_patch},
            {"target": {"kind": "Job"}, "patch": alias_patch},
        ],
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kustomization.yaml").write_text(
        "# Written by tests/k8s/deployed.py: the dev overlay, addressing changed only.\n"
        + yaml.safe_dump(kustomization, sort_keys=False)
    )
    return folder


def render(folder: Path, *, install: bool) -> list[dict[str, Any]]:
    argv = [*command(install=install), str(folder)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise DeployFailed(f"kustomize failed on the rig overlay: {done.stderr}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def unpack_images(node: RealNodeAccess) -> None:
    """The rig stores control-plane and nats without unpacking them (only these tests run
    them); unpack them once now so the first pods do not pay for it under the kubelet's
    CreateContainer deadline."""
    built = read_images(images_folder())
    for short in ("control-plane", "nats"):
        ref, archive = built[short]
        for argv in (
            ["images", "import", str(archive)],
            *(["images", "tag", "--force", ref, alias] for alias in IMAGE_ALIASES[short]),
        ):
            done = subprocess.run(
                ["ctr", "--address", str(node.containerd_socket), "--namespace", "k8s.io", *argv],
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
            if done.returncode != 0:
                raise DeployFailed(f"ctr {' '.join(argv)}: {done.stderr.strip()[-1000:]}")


def apply(api: Apiserver, docs: list[dict[str, Any]]) -> None:
    """Server-side apply, the Namespace first (what ``kubectl apply -k`` does)."""
    ordered = sorted(docs, key=lambda d: d["kind"] != "Namespace")
    for doc in ordered:
        applied = api.apply(doc, dry_run=False)
        if applied.status not in (200, 201):
            what = f"{doc['kind']}/{doc['metadata']['name']}"
            raise DeployFailed(f"apply {what}: {applied.status} {applied.body}")


def _get(api: Apiserver, path: str) -> dict[str, Any]:
    reply = api.client.get(path)
    reply.raise_for_status()
    body: dict[str, Any] = reply.json()
    return body


def pending_workloads(api: Apiserver) -> list[str]:
    """What is not up yet: Deployments not Available, NATS not Ready, the Job not Complete."""
    ns = NAMESPACE
    waiting = []
    for name in SERVICES:
        status = _get(api, f"/apis/apps/v1/namespaces/{ns}/deployments/torpor-{name}")["status"]
        if status.get("availableReplicas", 0) < 1 or status.get("updatedReplicas", 0) < 1:
            waiting.append(f"deployment/torpor-{name}")
    nats = _get(api, f"/apis/apps/v1/namespaces/{ns}/statefulsets/torpor-nats")["status"]
    if nats.get("readyReplicas", 0) < 1:
        waiting.append("statefulset/torpor-nats")
    job = _get(api, f"/apis/batch/v1/namespaces/{ns}/jobs/torpor-provision")["status"]
    complete = any(
        c["type"] == "Complete" and c["status"] == "True" for c in job.get("conditions", [])
    )
    if not complete:
        waiting.append("job/torpor-provision")
    return waiting


def pods_report(api: Apiserver) -> str:
    """One line per pod (phase, ready, restarts, last state): the failure message."""
    lines = []
    for pod in _get(api, f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]:
        statuses = pod["status"].get("containerStatuses", [])
        detail = [
            f"{s['name']} ready={s['ready']} restarts={s['restartCount']} "
            f"state={list(s.get('state', {}))} last={s.get('lastState', {})}"
            for s in statuses
        ]
        lines.append(f"{pod['metadata']['name']} {pod['status'].get('phase')} {detail}")
    events = _get(api, f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
    lines += [
        f"event {e['involvedObject']['name']}: {e['reason']}: {e.get('message', '')}"
        for e in events[-30:]
        if e.get("type") == "Warning"
    ]
    return "\n".join(lines)


def wait_up(api: Apiserver, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while waiting := pending_workloads(api):
        if time.monotonic() > deadline:
            raise DeployFailed(f"not up in {timeout:.0f} s: {waiting}\n{pods_report(api)}")
        time.sleep(1)


def service_ip(api: Apiserver, name: str) -> str:
    spec = _get(api, f"/api/v1/namespaces/{NAMESPACE}/services/{name}")["spec"]
    return str(ipaddress.ip_address(spec["clusterIP"]))


def deploy(node: RealNodeAccess, workdir: Path, *, install: bool, timeout: float) -> Deployed:
    began = time.monotonic()
    docs = render(write_rig_overlay(workdir / "overlay", node), install=install)
    unpack_images(node)
    api = Apiserver(Path(node.cluster.kubeconfig), workdir / "apiserver")
    try:
        apply(api, docs)
        wait_up(api, timeout=timeout)
        api_ip, proxy_ip = service_ip(api, "torpor-api"), service_ip(api, "torpor-proxy")
    finally:
        api.close()
    return Deployed(
        api_url=f"http://{api_ip}",
        proxy_url=f"http://{proxy_ip}",
        api_key=DEV_API_KEY,
        nats_ip=nats_cluster_ip(node),
        took=time.monotonic() - began,
    )
