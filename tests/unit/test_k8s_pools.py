"""The Kubernetes warm-pool objects (shared/runtime/kubernetes/pools.py): pure functions."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from shared.ports.workloads import LABEL_SANDBOX_ID
from shared.runtime.kubernetes.objects import ACCESS_TOKEN_ENV, ANNOTATION_PERSIST, never_started
from shared.runtime.kubernetes.pools import (
    ANNOTATION_CLAIMED,
    ANNOTATION_SECRET,
    LABEL_POOL,
    LABEL_POOL_VERSION,
    UNGATE_PATCH,
    WARM_GATE,
    claim_patch,
    claimable,
    is_warm_gated,
    pool_pod_body,
    poolable,
    template_version,
    warm_gated,
)

pytestmark = pytest.mark.unit

TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"app": "sandbox"}, "annotations": {ANNOTATION_PERSIST: "none"}},
    "spec": {
        "containers": [
            {
                "name": "envd",
                "image": "i",
                "env": [{"name": ACCESS_TOKEN_ENV, "value": "from-the-template"}],
                "volumeMounts": [{"name": "data", "mountPath": "/home/user"}],
            }
        ],
        "volumes": [{"name": "data", "emptyDir": {}}],
    },
}


def test_only_templates_that_decide_nothing_at_pod_start_are_pooled() -> None:
    assert poolable(TEMPLATE)
    keeps_files = copy.deepcopy(TEMPLATE)
    keeps_files["metadata"]["annotations"][ANNOTATION_PERSIST] = "layer"
    assert not poolable(keeps_files)
    shared = copy.deepcopy(TEMPLATE)
    shared["spec"]["containers"][0]["volumeMounts"].append(
        {"name": "s", "mountPath": "/mnt/shared", "subPathExpr": "$(OWNER)/$(SANDBOX_ID)"}
    )
    assert not poolable(shared)  # a pool pod would mount the root: every sandbox's files


def test_a_pool_pod_has_its_own_token_and_no_sandbox() -> None:
    pod = pool_pod_body("sandbox-fresh", TEMPLATE, 0, "one-time")
    meta = pod["metadata"]
    assert meta["name"].startswith("pool-") and LABEL_SANDBOX_ID not in meta["labels"]
    assert LABEL_POOL in meta["labels"] and meta["annotations"][ANNOTATION_SECRET] == "one-time"
    env = pod["spec"]["containers"][0]["env"]
    assert [e["value"] for e in env if e["name"] == ACCESS_TOKEN_ENV] == ["one-time"]
    assert TEMPLATE["spec"]["containers"][0]["env"][0]["value"] == "from-the-template"


def test_a_claim_is_guarded_by_the_version_seen() -> None:
    pod = pool_pod_body("sandbox-fresh", TEMPLATE, 0, "s")
    pod["metadata"]["resourceVersion"] = "42"
    pod["status"] = {
        "phase": "Running",
        "podIP": "10.0.0.2",
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    version = template_version(TEMPLATE)
    assert claimable(pod, "sandbox-fresh", version)
    patch = claim_patch(pod, {LABEL_SANDBOX_ID: "sbx-1"}, claimer="sbx-1")["metadata"]
    assert patch["resourceVersion"] == "42" and patch["labels"][LABEL_POOL] is None
    assert patch["annotations"][ANNOTATION_CLAIMED] == "sbx-1"
    pod["metadata"]["annotations"][ANNOTATION_CLAIMED] = "sbx-1"
    assert not claimable(pod, "sandbox-fresh", version)  # taken: never a second time
    pod["metadata"]["annotations"].pop(ANNOTATION_CLAIMED)
    pod["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "uid": "u"}]
    assert not claimable(pod, "sandbox-fresh", version)


def ready(pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["resourceVersion"] = "1"
    pod["status"] = {
        "phase": "Running",
        "podIP": "10.0.0.2",
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    return pod


@pytest.mark.parametrize(
    "change",
    [
        lambda c: c.update(image="other"),
        lambda c: c["env"].append({"name": "LANG", "value": "C"}),
        lambda c: c.update(resources={"limits": {"memory": "1Gi"}}),
        lambda c: c.update(command=["/bin/other"]),
    ],
    ids=["image", "env", "limits", "command"],
)
def test_a_pool_pod_of_an_older_template_is_never_claimed(change: Any) -> None:
    pod = ready(pool_pod_body("sandbox-fresh", TEMPLATE, 0, "s"))
    old = template_version(TEMPLATE)
    assert pod["metadata"]["labels"][LABEL_POOL_VERSION] == old
    newer = copy.deepcopy(TEMPLATE)
    change(newer["spec"]["containers"][0])
    new = template_version(newer)
    assert new != old
    assert claimable(pod, "sandbox-fresh", old) and not claimable(pod, "sandbox-fresh", new)


def test_a_pool_pod_of_another_template_is_never_claimed() -> None:
    """Same version digest, crafted labels: the template's name must match as well."""
    version = template_version(TEMPLATE)
    pod = ready(pool_pod_body("sandbox-fresh", TEMPLATE, 0, "s"))
    for other in ("sandbox-other", "sandbox-fresh\0", "--ro-bind", ""):
        assert not claimable(pod, other, version)
    pod["metadata"]["labels"][LABEL_POOL_VERSION] = "--ro-bind"
    assert not claimable(pod, "sandbox-fresh", version)


def _pod(created: object, phase: str = "Pending", ready: bool = False) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if ready:
        status |= {"podIP": "10.0.0.9", "conditions": [{"type": "Ready", "status": "True"}]}
    return {"metadata": {"name": "pool-x", "creationTimestamp": created}, "status": status}


def test_a_pool_pod_never_started_after_the_timeout_or_when_it_failed() -> None:
    now = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    assert not never_started(_pod("2026-12-01T08:59:58Z"), 5, now=now)
    assert never_started(_pod("2026-12-01T08:59:50Z"), 5, now=now)
    assert never_started(_pod("2026-12-01T08:59:59Z", phase="Failed"), 5, now=now)
    assert never_started(_pod("2026-12-01T08:59:59Z", phase="Succeeded"), 5, now=now)
    assert not never_started(_pod("2026-12-01T08:00:00Z", "Running", ready=True), 5, now=now)
    # A creation time that cannot be read never deletes a pod by age alone.
    for odd in (None, "", "yesterday", "2026-12-01T08:00:00", "--all", "2026\x00-12-01", 10**30):
        assert not never_started(_pod(odd), 5, now=now), odd


def test_the_warm_resume_gate_is_added_once_and_keeps_other_gates() -> None:
    template = copy.deepcopy(TEMPLATE)
    template["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    gated = warm_gated(template)
    assert gated["spec"]["schedulingGates"] == [{"name": "example.com/quota"}, {"name": WARM_GATE}]
    assert warm_gated(gated) == gated  # once
    assert is_warm_gated(gated) and not is_warm_gated(template) and not is_warm_gated(TEMPLATE)
    assert template["spec"]["schedulingGates"] == [{"name": "example.com/quota"}]  # a copy
    # Lifting it deletes that one gate by name (strategic merge), nothing else.
    (gate,) = UNGATE_PATCH["spec"]["template"]["spec"]["schedulingGates"]
    assert gate == {"name": WARM_GATE, "$patch": "delete"}
