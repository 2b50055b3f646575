"""Pure translation between torpor's runtime models and Kubernetes objects (no I/O).

Pods are handled as raw JSON dicts (as the API and the watch stream deliver them); ReplicaSets
as the client's models.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from shared.errors import ConfigError
from shared.ids import is_valid_sandbox_id
from shared.models.network import NetworkPolicy
from shared.ports.workloads import (
    ENVD_PORT,
    LABEL_MANAGED_BY,
    LABEL_OWNER,
    LABEL_SANDBOX_ID,
    MANAGED_BY,
    Endpoint,
    Workload,
    WorkloadSpec,
)

if TYPE_CHECKING:  # annotations only: importing the client costs seconds (the unit tier)
    from kubernetes.aio.client import V1ReplicaSet

LABEL_TEMPLATE = "torpor.dev/template"
# torpor's own version of the annotations, bumped by every patch_annotations. The object's
# resourceVersion cannot serve: controller status writes bump it all the time, so a version read
# a moment ago would already be stale. Hidden from ``Workload.annotations``.
ANNOTATION_REVISION = "torpor.dev/revision"
# Names of the daemon env entries that come from the sandbox (user envs, token), not the template:
# what a re-render at resume carries over into the current template.
ANNOTATION_SANDBOX_ENV = "torpor.dev/sandbox-env"
ACCESS_TOKEN_ENV = "ENVD_ACCESS_TOKEN"  # noqa: S105 - a variable name, not a secret
DAEMON_CONTAINER = "envd"

Pod = dict[str, Any]


def selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def sandbox_selector(name: str) -> str:
    return selector({LABEL_SANDBOX_ID: name})


def replica_set_body(spec: WorkloadSpec, pod_template: dict[str, Any]) -> dict[str, Any]:
    """The ReplicaSet for one sandbox: the template's pod, labelled and given the sandbox's env."""
    identity = {
        LABEL_SANDBOX_ID: spec.name,
        LABEL_OWNER: spec.owner,
        LABEL_MANAGED_BY: MANAGED_BY,
    }
    labels = {**spec.labels, **identity, LABEL_TEMPLATE: spec.template}
    extra = dict(spec.envs)
    if spec.access_token:
        extra[ACCESS_TOKEN_ENV] = spec.access_token
    pod_template = sandbox_pod_template(pod_template, labels, extra)
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": spec.name,
            "labels": labels,
            "annotations": {
                **spec.annotations,
                ANNOTATION_SANDBOX_ENV: json.dumps(sorted(extra)),
                ANNOTATION_REVISION: "1",
            },
        },
        "spec": {
            "replicas": spec.replicas,
            # Only the id: the selector is immutable, labels like the owner's stay editable.
            "selector": {"matchLabels": {LABEL_SANDBOX_ID: spec.name}},
            "template": pod_template,
        },
    }


def _daemon(pod_template: dict[str, Any]) -> dict[str, Any]:
    containers = pod_template["spec"]["containers"]
    found: dict[str, Any] = next(
        (c for c in containers if c.get("name") == DAEMON_CONTAINER), containers[0]
    )
    return found


def sandbox_pod_template(
    pod_template: dict[str, Any], labels: Mapping[str, str], extra_env: Mapping[str, str]
) -> dict[str, Any]:
    """The template's pod with the sandbox's labels and env (which win over the template's),
    and its data volume on the sandbox's own claim when the template keeps files."""
    meta = pod_template.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), **labels}
    daemon = _daemon(pod_template)
    env = [e for e in daemon.get("env") or [] if e.get("name") not in extra_env]
    env += [{"name": k, "value": v} for k, v in sorted(extra_env.items())]
    daemon["env"] = env
    return with_sandbox_data(pod_template, labels[LABEL_SANDBOX_ID])


def rerendered_pod_template(rs: Any, fresh: dict[str, Any]) -> dict[str, Any] | None:
    """``fresh`` (the template as it is now) with the sandbox's own labels and env taken from
    the ReplicaSet ``rs`` (raw JSON); ``None`` for a ReplicaSet made before torpor recorded
    which env entries are the sandbox's (it keeps its creation-time pod template)."""
    meta = rs.get("metadata") or {}
    names = (meta.get("annotations") or {}).get(ANNOTATION_SANDBOX_ENV)
    if names is None:
        return None
    try:
        wanted = set(json.loads(names))
    except ValueError:
        return None
    current = rs["spec"]["template"]
    extra = {
        e["name"]: e.get("value", "")
        for e in _daemon(current).get("env") or []
        if e.get("name") in wanted and "valueFrom" not in e
    }
    # The ReplicaSet's own labels are exactly the sandbox's (the pod's also hold the template's).
    return sandbox_pod_template(fresh, meta.get("labels") or {}, extra)


# ---- files kept across a pause -----------------------------------------------------------------

# A template's pod mounts its writable paths (/home/user, /workspace: subPaths) from the volume of
# this name, an emptyDir in the template. Unless the template says ``torpor.dev/persist: none``,
# the adapter puts that volume on a PersistentVolumeClaim of the sandbox's own, which outlives
# its pods: a pause (scale to 0) and resume (scale to 1) find the files again.
DATA_VOLUME = "sandbox-data"
ANNOTATION_PERSIST = "torpor.dev/persist"
# ``store``: the data volume stays an emptyDir and the files go to the kept-files store at pause
# (``.kept``), so a warm pool pod can take them back; ``layer``, ``none`` as the local runtime's.
PERSIST_MODES = ("layer", "none", "store")
CLAIM_PREFIX = "torpor-data-"
DEFAULT_CLAIM_SIZE = "2Gi"


def claim_name(sandbox_id: str) -> str:
    """The sandbox's claim: derived from its (validated) id only, never from a template or a
    request, so no sandbox can name another's."""
    if not is_valid_sandbox_id(sandbox_id):
        msg = f"invalid sandbox id {sandbox_id!r}"
        raise ValueError(msg)
    return CLAIM_PREFIX + sandbox_id


def persist_mode(pod_template: Mapping[str, Any]) -> str:
    annotations = (pod_template.get("metadata") or {}).get("annotations") or {}
    mode = annotations.get(ANNOTATION_PERSIST, "layer")
    if mode not in PERSIST_MODES:
        msg = f"template annotation {ANNOTATION_PERSIST}: {mode!r} is not one of {PERSIST_MODES}"
        raise ConfigError(msg)
    return str(mode)


def check_volumes(pod_template: Mapping[str, Any]) -> None:
    """A sandbox template may not reach the host's disk, nor any sandbox's claim: those are
    the adapter's to attach, by the sandbox's id."""
    for volume in (pod_template.get("spec") or {}).get("volumes") or []:
        name = volume.get("name")
        if "hostPath" in volume:
            msg = f"sandbox template volume {name!r}: hostPath is not allowed"
            raise ConfigError(msg)
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName", "")
        if str(claim).startswith(CLAIM_PREFIX):
            msg = f"sandbox template volume {name!r}: claim {claim!r} is reserved for sandboxes"
            raise ConfigError(msg)


def with_sandbox_data(pod_template: dict[str, Any], sandbox_id: str) -> dict[str, Any]:
    """``pod_template`` with its data volume on the sandbox's claim (``persist: layer``, the
    default) or left an emptyDir (``persist: none``: a fresh disk for every pod; ``persist:
    store``: one the kept files are imported into)."""
    check_volumes(pod_template)
    if persist_mode(pod_template) in ("none", "store"):
        return pod_template
    for i, volume in enumerate((pod_template.get("spec") or {}).get("volumes") or []):
        if volume.get("name") == DATA_VOLUME:
            pod_template["spec"]["volumes"][i] = {
                "name": DATA_VOLUME,
                "persistentVolumeClaim": {"claimName": claim_name(sandbox_id)},
            }
    return pod_template


def claim_size(pod_template: Mapping[str, Any]) -> str:
    """The template's data volume's ``emptyDir.sizeLimit``: what the claim requests."""
    for volume in (pod_template.get("spec") or {}).get("volumes") or []:
        if volume.get("name") == DATA_VOLUME:
            return str((volume.get("emptyDir") or {}).get("sizeLimit") or DEFAULT_CLAIM_SIZE)
    return DEFAULT_CLAIM_SIZE


def uses_claim(pod_template: Mapping[str, Any]) -> bool:
    return any(
        v.get("name") == DATA_VOLUME and "persistentVolumeClaim" in v
        for v in (pod_template.get("spec") or {}).get("volumes") or []
    )


def claim_body(
    sandbox_id: str, *, rs_uid: str, size: str, storage_class: str | None
) -> dict[str, Any]:
    """The sandbox's PersistentVolumeClaim, owned by its ReplicaSet: deleting the sandbox's
    ReplicaSet lets the garbage collector delete the claim, even if torpor's own delete did not
    get that far."""
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": size}},
    }
    if storage_class:  # unset: the cluster's default StorageClass
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": claim_name(sandbox_id),
            "labels": {LABEL_SANDBOX_ID: sandbox_id, LABEL_MANAGED_BY: MANAGED_BY},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": sandbox_id, "uid": rs_uid}
            ],
        },
        "spec": spec,
    }


def claim_is_ours(claim: Mapping[str, Any], sandbox_id: str, rs_uid: str) -> bool:
    """Whether an existing claim of that name is this sandbox's live one (not a stale claim of a
    deleted sandbox of the same id, nor anyone else's object)."""
    meta = claim.get("metadata") or {}
    labels = meta.get("labels") or {}
    return (
        labels.get(LABEL_SANDBOX_ID) == sandbox_id
        and labels.get(LABEL_MANAGED_BY) == MANAGED_BY
        and meta.get("deletionTimestamp") is None
        and any(r.get("uid") == rs_uid for r in meta.get("ownerReferences") or [])
    )


_RUNTIME_ANNOTATIONS = frozenset({ANNOTATION_REVISION, ANNOTATION_SANDBOX_ENV})


def revision(rs: V1ReplicaSet) -> str:
    annotations = (rs.metadata.annotations if rs.metadata else None) or {}
    return annotations.get(ANNOTATION_REVISION, "0")


def _pointer(key: str) -> str:
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


def annotation_patch(
    rs: V1ReplicaSet, changes: Mapping[str, str | None], expected: str
) -> list[dict[str, Any]]:
    """A JSON Patch that applies ``changes`` only while the revision is still ``expected``.

    The server evaluates ``test`` against the object it writes, so the whole patch is a
    compare-and-set on torpor's revision, immune to unrelated status updates.
    """
    current = (rs.metadata.annotations if rs.metadata else None) or {}
    if managed := _RUNTIME_ANNOTATIONS & set(changes):
        msg = f"{', '.join(sorted(managed))} is managed by the runtime"
        raise ValueError(msg)
    ops: list[dict[str, Any]] = []
    if not current:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    if ANNOTATION_REVISION in current:
        ops.append({"op": "test", "path": _pointer(ANNOTATION_REVISION), "value": expected})
    for key, value in changes.items():
        if value is None:
            if key in current:
                ops.append({"op": "remove", "path": _pointer(key)})
        else:
            ops.append({"op": "add", "path": _pointer(key), "value": value})
    next_revision = str(int(expected) + 1) if expected.isdigit() else "1"
    ops.append({"op": "add", "path": _pointer(ANNOTATION_REVISION), "value": next_revision})
    return ops


def owner_reference(rs_name: str, rs_uid: str) -> dict[str, Any]:
    """A pod's controller reference to its ReplicaSet, as the ReplicaSet controller's adoption
    writes it (without ``blockOwnerDeletion``: setting that needs the owner's finalizers
    permission where owner references are enforced, and torpor deletes in the background)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": rs_name,
        "uid": rs_uid,
        "controller": True,
    }


def owned_by(pod: Pod, rs_uid: str | None) -> bool:
    refs = pod.get("metadata", {}).get("ownerReferences") or []
    return rs_uid is None or any(r.get("uid") == rs_uid for r in refs)


def is_terminating(pod: Pod) -> bool:
    return pod.get("metadata", {}).get("deletionTimestamp") is not None


def is_ready(pod: Pod) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or not status.get("podIP"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def never_started(pod: Pod, start_timeout: float, *, now: datetime | None = None) -> bool:
    """A pod that will not become ready: it failed or ended, or it is not ready
    ``start_timeout`` seconds after it was created (an unreadable creation time counts as now)."""
    if is_ready(pod):
        return False
    if (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
        return True
    raw = (pod.get("metadata") or {}).get("creationTimestamp")
    if isinstance(raw, datetime):
        created = raw
    else:
        try:
            created = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
        except ValueError:
            return False
    if created.tzinfo is None:
        return False
    return ((now or datetime.now(UTC)) - created).total_seconds() > start_timeout


def current_pod(pods: Iterable[Pod], rs_uid: str | None) -> Pod | None:
    """The live pod of a workload: not terminating, Ready preferred, then the newest."""
    live = [p for p in pods if owned_by(p, rs_uid) and not is_terminating(p)]
    if not live:
        return None
    live.sort(key=lambda p: (is_ready(p), p["metadata"].get("creationTimestamp") or ""))
    return live[-1]


def ready_endpoint(pods: Iterable[Pod], rs_uid: str | None) -> Endpoint | None:
    """The daemon's endpoint once a *new* pod is Ready: never a Terminating one from a pause."""
    pod = current_pod(pods, rs_uid)
    if pod is None or not is_ready(pod):
        return None
    return Endpoint(host=pod["status"]["podIP"], port=ENVD_PORT, pod_uid=pod["metadata"]["uid"])


def to_workload(rs: V1ReplicaSet, pods: Iterable[Pod]) -> Workload:
    meta, spec, status = rs.metadata, rs.spec, rs.status
    assert meta is not None
    assert meta.name is not None
    labels = dict(meta.labels or {})
    pod = current_pod(pods, meta.uid)
    return Workload(
        name=meta.name,
        template=labels.get(LABEL_TEMPLATE, "sandbox-base"),
        labels=labels,
        annotations={
            k: v for k, v in (meta.annotations or {}).items() if k not in _RUNTIME_ANNOTATIONS
        },
        replicas=(spec.replicas if spec is not None and spec.replicas is not None else 1),
        ready_replicas=(status.ready_replicas or 0) if status is not None else 0,
        resource_version=revision(rs),
        pod_uid=pod["metadata"]["uid"] if pod else None,
        pod_ip=(pod.get("status") or {}).get("podIP") if pod else None,
    )


# ---- network policy -------------------------------------------------------------------------

# Control-plane pods that talk to sandboxes (proxy, scaler, snapshotter, scheduler, builder)
# carry this label; a sandbox pod accepts connections from them only (deploy/kustomize/base
# sets it; tests/deploy/test_manifests.py checks which services do).
LABEL_SANDBOX_ACCESS = "torpor.dev/sandbox-access"
_ALL = {4: "0.0.0.0/0", 6: "::/0"}


def egress_rules(policy: NetworkPolicy) -> list[dict[str, Any]]:
    """E2B's rule (``NetworkPolicy.permits``) as NetworkPolicy egress rules, which only allow:
    the ``allow_out`` blocks, plus everything except the effective deny list. ``except`` must be
    strictly inside its ``cidr``, so a family whose deny list holds ``/0`` gets no block."""
    rules: list[dict[str, Any]] = []
    if policy.allow_out:
        rules.append({"to": [{"ipBlock": {"cidr": c}} for c in policy.allow_out]})
    deny = [ipaddress.ip_network(c) for c in policy.effective_deny]
    if not deny:
        rules.append({})  # no ``to``: every destination
        return rules
    peers: list[dict[str, Any]] = []
    for family, everything in _ALL.items():
        nets = [n for n in deny if n.version == family]
        if any(n.prefixlen == 0 for n in nets):
            continue
        block: dict[str, Any] = {"cidr": everything}
        if nets:
            block["except"] = [str(n) for n in nets]
        peers.append({"ipBlock": block})
    if peers:
        rules.append({"to": peers})
    return rules


def network_policy_body(
    name: str, policy: NetworkPolicy, *, control_plane_namespace: str | None = None
) -> dict[str, Any]:
    """The per-sandbox NetworkPolicy (server-side applied): egress from the sandbox's policy;
    ingress only from torpor's control-plane pods (the daemon port and user ports alike: user
    traffic arrives through the proxy)."""
    peer: dict[str, Any] = {"podSelector": {"matchLabels": {LABEL_SANDBOX_ACCESS: "true"}}}
    if control_plane_namespace:
        peer["namespaceSelector"] = {
            "matchLabels": {"kubernetes.io/metadata.name": control_plane_namespace}
        }
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": name,
            "labels": {LABEL_SANDBOX_ID: name, LABEL_MANAGED_BY: MANAGED_BY},
        },
        "spec": {
            "podSelector": {"matchLabels": {LABEL_SANDBOX_ID: name}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [peer]}],
            "egress": egress_rules(policy),
        },
    }
