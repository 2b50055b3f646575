"""Warm pools on Kubernetes, as plain objects: bare pool Pods, claimed by relabelling.

A pool pod is a bare Pod (no owner) named ``pool-<template hash>-<slot>`` (a slot is filled by a
``create``: two scalers never both fill it), labelled ``torpor.dev/pool``, its daemon holding a
one-time token (``torpor.dev/pool-secret``) instead of a sandbox's. A claim is one merge patch
of the pod at the ``resourceVersion`` it was seen at (one winner): the pool label goes, the
sandbox's pod-template labels come (so its NetworkPolicy selects it at once), and the sandbox's
ReplicaSet, which selects by ``torpor.dev/sandbox-id``, adopts it as its one replica. Before
that, the daemon gets the sandbox's env vars and token over ``/init`` with the one-time token
(``torpor.dev/bound`` records it). A claimed pod that was never bound (its claimer died) is
deleted, never served; one never adopted is deleted after a while. A pool pod is labelled with
the version (digest) of the pod template it was made from: one of another version is never
claimed, and the refill deletes it and makes one of the template as it is now.

What does not work: a pool pod cannot have a sandbox's PersistentVolumeClaim mounted in advance
(a running pod gets no new volume), so pools serve templates with ``persist: none`` and
``persist: store`` (kept files imported by the daemon after the claim, ``.kept``); for
``persist: layer`` the runtime starts pods cold. The pod's hostname stays its pool name.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from shared.ports.workloads import LABEL_MANAGED_BY, MANAGED_BY
from shared.runtime.kubernetes.objects import (
    ACCESS_TOKEN_ENV,
    ANNOTATION_SANDBOX_ENV,
    DAEMON_CONTAINER,
    LABEL_TEMPLATE,
    Pod,
    is_ready,
    is_terminating,
    persist_mode,
)

LABEL_POOL = "torpor.dev/pool"
LABEL_POOL_VERSION = "torpor.dev/pool-version"  # the template version the pod was made from
ANNOTATION_SECRET = "torpor.dev/pool-secret"  # noqa: S105 - an annotation name
ANNOTATION_CLAIMED = "torpor.dev/claimed"
ANNOTATION_BOUND = "torpor.dev/bound"
ANNOTATION_CLAIMED_AT = "torpor.dev/claimed-at"
# On a sandbox's pod template while a resume hands it a warm pod: the pod its ReplicaSet makes in
# the moment between the scale and the adoption is never scheduled (nor started), and the
# ReplicaSet deletes it (unscheduled goes first) once it has the warm one.
WARM_GATE = "torpor.dev/warm-resume"


def pool_key(template: str) -> str:
    return hashlib.sha256(template.encode()).hexdigest()[:10]


def slot_name(template: str, slot: int) -> str:
    return f"pool-{pool_key(template)}-{slot}"


def template_version(pod_template: Mapping[str, Any]) -> str:
    """The pod template as a short digest (image, env, limits, command, volumes, ...): a pool
    pod made from another version of its template is never claimed."""
    text = json.dumps(pod_template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def pool_selector(template: str, version: str | None = None) -> dict[str, str]:
    """The labels of ``template``'s pool pods (of one ``version`` of it, when given)."""
    labels = {LABEL_POOL: pool_key(template), LABEL_TEMPLATE: template}
    return labels if version is None else {**labels, LABEL_POOL_VERSION: version}


def pool_pod_body(
    template: str, pod_template: dict[str, Any], slot: int, secret: str
) -> dict[str, Any]:
    """The bare pool Pod of one slot: the template's pod, no sandbox, a one-time token."""
    pod = copy.deepcopy(pod_template)
    meta = pod.setdefault("metadata", {})
    labels = {
        **(meta.get("labels") or {}),
        LABEL_MANAGED_BY: MANAGED_BY,
        **pool_selector(template, template_version(pod_template)),
    }
    containers = pod["spec"]["containers"]
    daemon = next((c for c in containers if c.get("name") == DAEMON_CONTAINER), containers[0])
    env = [e for e in daemon.get("env") or [] if e.get("name") != ACCESS_TOKEN_ENV]
    daemon["env"] = [*env, {"name": ACCESS_TOKEN_ENV, "value": secret}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": slot_name(template, slot),
            "labels": labels,
            "annotations": {
                **(meta.get("annotations") or {}),
                ANNOTATION_SECRET: secret,
            },
        },
        "spec": pod["spec"],
    }


def poolable(pod_template: Mapping[str, Any]) -> bool:
    """Whether warm pods can serve this template: nothing of a sandbox may be decided when the
    pod starts. ``persist: none`` and ``store`` (its files are imported after the claim, see
    ``.kept``); not ``persist: layer`` (the sandbox's claim), nor with a ``subPathExpr``
    (expanded from the pod's labels at start: a pool pod has no sandbox's labels then, and would
    mount the volume's root, every sandbox's files)."""
    if persist_mode(pod_template) == "layer":
        return False
    spec = pod_template.get("spec") or {}
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        if any("subPathExpr" in m for m in container.get("volumeMounts") or []):
            return False
    return True


def warm_gated(pod_template: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``pod_template`` (a pod's or a ReplicaSet's) with the warm-resume gate."""
    gated = copy.deepcopy(dict(pod_template))
    spec = gated.setdefault("spec", {})
    gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != WARM_GATE]
    spec["schedulingGates"] = [*gates, {"name": WARM_GATE}]
    return gated


def is_warm_gated(pod_or_template: Mapping[str, Any]) -> bool:
    gates = (pod_or_template.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == WARM_GATE for g in gates)


# Strategic merge patch of a ReplicaSet: its pod template loses the gate, any other gate stays.
UNGATE_PATCH: dict[str, Any] = {
    "spec": {"template": {"spec": {"schedulingGates": [{"name": WARM_GATE, "$patch": "delete"}]}}}
}


def claimable(pod: Pod, template: str, version: str) -> bool:
    """Whether ``pod`` is a ready, untaken pool pod of ``version`` of ``template``."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    return (
        all(labels.get(k) == v for k, v in pool_selector(template, version).items())
        and not meta.get("ownerReferences")
        and ANNOTATION_CLAIMED not in (meta.get("annotations") or {})
        and not is_terminating(pod)
        and is_ready(pod)
    )


def claim_patch(pod: Pod, labels: dict[str, str], claimer: str) -> dict[str, Any]:
    """Merge patch taking ``pod`` for a sandbox: only at the version it was seen at."""
    meta = pod["metadata"]
    return {
        "metadata": {
            "resourceVersion": meta["resourceVersion"],
            "labels": {LABEL_POOL: None, **labels},
            "annotations": {ANNOTATION_CLAIMED: claimer},
        }
    }


def sandbox_env(rs_template: dict[str, Any], names_json: str | None) -> dict[str, str]:
    """The sandbox's own env (user envs, token) from its ReplicaSet's pod template."""
    names = set(json.loads(names_json)) if names_json else set()
    containers = (rs_template.get("spec") or {}).get("containers") or []
    daemon = next(
        (c for c in containers if c.get("name") == DAEMON_CONTAINER),
        containers[0] if containers else {},
    )
    return {
        e["name"]: str(e.get("value", ""))
        for e in daemon.get("env") or []
        if e.get("name") in names and "value" in e
    }


__all__ = [
    "ANNOTATION_BOUND",
    "ANNOTATION_CLAIMED",
    "ANNOTATION_CLAIMED_AT",
    "ANNOTATION_SANDBOX_ENV",
    "ANNOTATION_SECRET",
    "LABEL_POOL",
    "LABEL_POOL_VERSION",
    "UNGATE_PATCH",
    "WARM_GATE",
    "claim_patch",
    "claimable",
    "is_warm_gated",
    "pool_key",
    "pool_pod_body",
    "pool_selector",
    "poolable",
    "sandbox_env",
    "slot_name",
    "template_version",
    "warm_gated",
]
