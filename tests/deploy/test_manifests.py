"""The kustomize overlays: rendered by a real kustomize, checked for what an operator relies on,
and applied with server-side dry-run to the real kube-apiserver (no errors, no warnings)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.runtime.kubernetes.objects import LABEL_SANDBOX_ACCESS
from tests.conftest import skip_or_fail
from tests.deploy.apiserver import Apiserver
from tests.deploy.kustomize import OVERLAYS, REPO, KustomizeMissing, render
from tests.deploy.nats_auth import load_generator
from tests.support.k8s.rig import ClusterAccess

SERVICES = ("api", "proxy", "scheduler", "snapshotter", "scaler", "deliverer", "ledger", "builder")
# the runtime adapter; the others talk only to NATS
NEEDS_KUBE_API = {"scaler", "snapshotter", "builder"}


def _render(overlay: str) -> list[dict[str, Any]]:
    import os

    try:
        return render(overlay, install=os.environ.get("CI", "").lower() == "true")
    except KustomizeMissing as e:
        skip_or_fail(str(e))
        raise


@pytest.fixture(scope="module", params=sorted(OVERLAYS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, _render(request.param)


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def containers(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from doc["spec"]["template"]["spec"]["containers"]


def configmap(docs: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    (found,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(prefix)
    ]
    return found


# ------------------------------------------------------------------ static checks


def test_one_deployment_per_service_with_probes_resources_and_a_pdb(rendered: Any) -> None:
    _, docs = rendered
    deployments = by_kind(docs, "Deployment")
    pdbs = by_kind(docs, "PodDisruptionBudget")
    assert set(deployments) == {f"torpor-{s}" for s in SERVICES}
    for service in SERVICES:
        dep = deployments[f"torpor-{service}"]
        (c,) = containers(dep)
        assert c["args"] == ["run", service]
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert probe in c, f"{service}: no {probe}"
        assert c["resources"]["requests"]
        assert c["resources"]["limits"]
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        pdb = pdbs[f"torpor-{service}"]
        assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
        anti = dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        assert anti, f"{service}: replicas may all land on one node"


def test_each_service_connects_as_its_own_nats_user(rendered: Any) -> None:
    """NATS_USER + NATS_PASSWORD (BusSettings' own fields: a NATS_PASSWORD without NATS_USER
    is a configuration error), the password from the Secret the overlay ships (dev: its
    generated, hashed name, in torpor's namespace) or the operator creates (production)."""
    overlay, docs = rendered
    shipped = {n: s["metadata"].get("namespace") for n, s in by_kind(docs, "Secret").items()}
    for service in SERVICES:
        (c,) = containers(by_kind(docs, "Deployment")[f"torpor-{service}"])
        env = {e["name"]: e for e in c["env"]}
        assert env["NATS_URL"]["value"] == "nats://torpor-nats:4222"
        assert env["NATS_USER"]["value"] == service
        ref = env["NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert ref["key"] == service
        if overlay == "dev":
            assert shipped.get(ref["name"]) == "torpor", (ref, shipped)
        else:
            assert ref["name"] == "torpor-nats-auth"
        config = configmap(docs, "torpor-config")["data"]
        # Services must not try to create streams their users may not create.
        assert config["TORPOR_BUS_PROVISION"] == "false"
        assert config["TORPOR_RUNTIME"] == "kubernetes"


def test_every_object_lands_in_torpors_namespace(rendered: Any) -> None:
    """Generated objects too: a Secret generated outside the namespace would leave the
    workloads' references unhashed (the real node caught the dev overlay doing that)."""
    _, docs = rendered
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == "torpor", doc["metadata"]


def test_only_the_runtime_services_get_kubernetes_credentials(rendered: Any) -> None:
    _, docs = rendered
    for service in SERVICES:
        spec = by_kind(docs, "Deployment")[f"torpor-{service}"]["spec"]["template"]["spec"]
        if service in NEEDS_KUBE_API:
            assert spec["serviceAccountName"] == "torpor-control-plane"
        else:
            assert spec.get("automountServiceAccountToken") is False
            assert "serviceAccountName" not in spec
    (binding,) = by_kind(docs, "RoleBinding").values()
    assert binding["subjects"][0]["name"] == "torpor-control-plane"


def test_env_references_are_defined_before_use(rendered: Any) -> None:
    """``$(VAR)`` expands only from variables earlier in the same list: a wrong order leaves the
    literal text in NATS_URL or a route URL."""
    _, docs = rendered
    for doc in docs:
        if doc["kind"] not in {"Deployment", "StatefulSet", "Job"}:
            continue
        for c in containers(doc):
            seen: set[str] = set()
            for e in c.get("env", []):
                for ref in re.findall(r"\$\(([A-Z0-9_]+)\)", e.get("value", "")):
                    assert ref in seen, (
                        f"{doc['metadata']['name']}: {e['name']} uses $({ref}) before it is set"
                    )
                seen.add(e["name"])


def test_nats_gets_every_password_and_the_shipped_config(rendered: Any) -> None:
    overlay, docs = rendered
    nats = by_kind(docs, "StatefulSet")["torpor-nats"]
    (c,) = containers(nats)
    env = {e["name"] for e in c["env"]}
    users = list(load_generator().users())
    for u in users:
        assert u.password_env in env
    data = configmap(docs, "torpor-nats-config")["data"]
    assert data["auth.conf"] == (REPO / "deploy/nats/auth.conf").read_text()
    assert data["nats.conf"] == (REPO / "deploy/nats/nats.conf").read_text()
    assert "sync_interval: always" in data["nats.conf"]
    replicas = nats["spec"]["replicas"]
    if overlay == "dev":
        assert replicas == 1
        assert "cluster {" not in data["cluster.conf"]
        secret = by_kind(docs, "Secret")
        (auth,) = [s for n, s in secret.items() if n.startswith("torpor-nats-auth")]
        assert {u.name for u in users} <= set(auth["data"])
    else:
        assert replicas == 3
        assert "cluster {" in data["cluster.conf"]
        assert "NATS_ROUTE_PASSWORD" in env
        assert configmap(docs, "torpor-config")["data"]["TORPOR_BUS_REPLICAS"] == "3"
        assert not by_kind(docs, "Secret"), "production must not ship secrets"
        anti = nats["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        assert anti["requiredDuringSchedulingIgnoredDuringExecution"], "R3 needs 3 nodes"


# Services that dial sandbox daemons at the pod IP (the proxy: traffic; the scaler: replay and
# hooks; the snapshotter: List and prePause; the scheduler: activity inside; the builder: builds).
DIALS_SANDBOXES = {"proxy", "scaler", "snapshotter", "scheduler", "builder"}
# Services that read the templates (the api: a create's template; the scaler: pods and hooks;
# the snapshotter: prePause and maxLifetime; the scheduler: the activity policy; the ledger:
# each sandbox's size).
READS_TEMPLATES = {"api", "scaler", "snapshotter", "scheduler", "ledger"}


def test_services_that_dial_sandboxes_carry_the_sandbox_access_label(rendered: Any) -> None:
    """Each sandbox's NetworkPolicy admits ingress only from pods with this label: without it,
    e.g. the scheduler's activity probe would time out and activity inside would never count."""
    _, docs = rendered
    deployments = by_kind(docs, "Deployment")
    for service in SERVICES:
        labels = deployments[f"torpor-{service}"]["spec"]["template"]["metadata"]["labels"]
        has = labels.get(LABEL_SANDBOX_ACCESS) == "true"
        assert has is (service in DIALS_SANDBOXES), f"{service}: {LABEL_SANDBOX_ACCESS}"


def test_the_services_reading_templates_mount_the_sandbox_templates(rendered: Any) -> None:
    overlay, docs = rendered
    config = configmap(docs, "torpor-config")["data"]
    templates = configmap(docs, "torpor-sandbox-templates")
    for service in sorted(READS_TEMPLATES):
        spec = by_kind(docs, "Deployment")[f"torpor-{service}"]["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        mount = next(m for m in c["volumeMounts"] if m["name"] == "templates")
        assert mount["mountPath"] == config["TORPOR_TEMPLATES_DIR"], service
        assert mount.get("readOnly") is True, service
        volume = next(v for v in spec["volumes"] if v["name"] == "templates")
        # the hash suffix followed
        assert volume["configMap"]["name"] == templates["metadata"]["name"], service
    template = yaml.safe_load(templates["data"]["sandbox-base.yaml"])
    assert template["kind"] == "PodTemplate"
    mounts = {
        m["mountPath"]
        for c in template["template"]["spec"]["containers"]
        for m in c.get("volumeMounts", [])
    }
    pvcs = by_kind(docs, "PersistentVolumeClaim")
    if overlay == "shared-storage":
        assert "/mnt/shared" in mounts
        assert "torpor-shared" in pvcs
        assert pvcs["torpor-shared"]["spec"]["accessModes"] == ["ReadWriteMany"]
    else:
        assert "/mnt/shared" not in mounts
        assert not pvcs


def test_pause_resume_flag_is_configurable(rendered: Any) -> None:
    overlay, docs = rendered
    flag = configmap(docs, "torpor-config")["data"]["PAUSE_RESUME"]
    assert flag == ("true" if overlay == "dev" else "false")


def test_images_are_pinned(rendered: Any) -> None:
    _, docs = rendered
    for doc in docs:
        if doc["kind"] in {"Deployment", "StatefulSet", "Job"}:
            for c in containers(doc):
                image = c["image"]
                assert ":" in image.rsplit("/", 1)[-1], image
                assert not image.endswith(":latest"), image


def test_shared_storage_template_is_generated_from_sandbox_base() -> None:
    import importlib.util
    import sys

    path = REPO / "deploy/kustomize/components/shared-storage/gen_template.py"
    spec = importlib.util.spec_from_file_location("torpor_gen_template", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    committed = (path.parent / "sandbox-base.yaml").read_text()
    target = path.parent.relative_to(REPO) / "sandbox-base.yaml"
    assert committed == module.render(), (
        f"stale: .venv/bin/python {path.relative_to(REPO)} > {target}"
    )


def test_dockerfiles_are_pinned_multi_stage_and_non_root() -> None:
    for name in ("control-plane", "sandbox-base"):
        text = (REPO / "deploy/docker" / f"{name}.Dockerfile").read_text()
        bases = re.findall(r"^ARG PYTHON_IMAGE=(\S+)", text, re.M)
        assert bases, f"{name}: no pinned base"
        assert re.search(r":\d+\.\d+\.\d+-", bases[0]), f"{name}: base not pinned to an exact tag"
        assert text.count("\nFROM ") >= 2, f"{name}: not multi-stage"
        assert re.search(r"^USER \d+", text, re.M), f"{name}: runs as root"
    sandbox = (REPO / "deploy/docker/sandbox-base.Dockerfile").read_text()
    assert "49983" in sandbox
    assert "shared" not in re.findall(r"^COPY (\S+)", sandbox, re.M)
    ignore = (REPO / ".dockerignore").read_text()
    assert "**" in ignore.splitlines()[1:] or ignore.splitlines()[1] == "**"


# ------------------------------------------------------------------ the real kube-apiserver


@pytest.fixture(scope="module")
def apiserver(
    k8s_cluster: ClusterAccess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Apiserver]:
    api = Apiserver(Path(k8s_cluster.kubeconfig), tmp_path_factory.mktemp("apiserver"))
    yield api
    api.close()


@pytest.mark.k8s
@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_server_side_dry_run_has_no_errors_and_no_warnings(
    apiserver: Apiserver, overlay: str
) -> None:
    docs = _render(overlay)
    # Namespaced objects can only be dry-run inside an existing namespace: create it for real.
    for ns in (d for d in docs if d["kind"] == "Namespace"):
        applied = apiserver.apply(ns, dry_run=False)
        assert applied.status in (200, 201), applied.body
        assert applied.warnings == []
    problems: list[str] = []
    for doc in docs:
        if doc["kind"] == "Namespace":
            continue
        applied = apiserver.apply(doc, dry_run=True)
        what = f"{doc['kind']}/{doc['metadata']['name']}"
        if applied.status not in (200, 201):
            problems.append(f"{what}: HTTP {applied.status} {applied.body.get('message')}")
        problems += [f"{what}: warning {w}" for w in applied.warnings]
    assert problems == []
    assert len(docs) > 20


@pytest.mark.k8s
@pytest.mark.parametrize("overlay", ["dev", "shared-storage"])
def test_sandbox_pod_templates_are_valid_pod_templates(apiserver: Apiserver, overlay: str) -> None:
    """The scaler's templates are only strings in a ConfigMap: validate them as the PodTemplate
    objects they are, so a typo fails here and not when the first sandbox is created."""
    docs = _render(overlay)
    templates = configmap(docs, "torpor-sandbox-templates")["data"]
    for key, text in templates.items():
        obj = yaml.safe_load(text)
        obj["metadata"]["namespace"] = "torpor"
        applied = apiserver.apply(obj, dry_run=True)
        assert applied.status in (200, 201), f"{key}: {applied.body.get('message')}"
        deprecated = [w for w in applied.warnings if "deprecated" in w.lower()]
        assert deprecated == []


@pytest.mark.k8s
def test_the_dry_run_does_report_warnings(apiserver: Apiserver) -> None:
    """Control for the test above: the same path sees the apiserver's Warning headers."""
    import copy

    docs = _render("dev")
    apiserver.apply(next(d for d in docs if d["kind"] == "Namespace"), dry_run=False)
    insecure = copy.deepcopy(by_kind(docs, "Deployment")["torpor-api"])
    insecure["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {}
    applied = apiserver.apply(insecure, dry_run=True)
    assert applied.status in (200, 201)
    assert any("PodSecurity" in w for w in applied.warnings), applied.warnings


def test_sandbox_image_installs_every_dependency_of_the_daemon() -> None:
    """The sandbox image carries services/envd alone with a hand-pinned dependency list: every
    third-party module the daemon imports (or names, like uvicorn's http="httptools") must be in
    it, or the image builds and the daemon dies at start."""
    import ast
    import importlib.metadata
    import sys

    dists = importlib.metadata.packages_distributions()
    needed: set[str] = set()
    for path in (REPO / "services/envd").glob("*.py"):
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in {"__future__", "services"}:
                    continue
                needed.update(d.lower() for d in dists.get(top, [top]))
        if 'http="httptools"' in source:
            needed.add("httptools")
    assert "shared" not in needed, "the daemon must not import the control plane"
    dockerfile = (REPO / "deploy/docker/sandbox-base.Dockerfile").read_text()
    pinned = {m.lower() for m in re.findall(r'"([A-Za-z0-9_.-]+)==[^"]+"', dockerfile)}
    assert needed <= pinned, f"missing from the sandbox image: {sorted(needed - pinned)}"
