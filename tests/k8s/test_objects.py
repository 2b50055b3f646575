"""Pure logic of the kubernetes adapter: object building, readiness, annotation CAS, templates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.aio.client import V1ReplicaSet

from shared.errors import NotFound
from shared.ports.workloads import LABEL_OWNER, LABEL_SANDBOX_ID, WorkloadSpec
from shared.runtime.kubernetes import DEFAULT_TEMPLATES, PodTemplates
from shared.runtime.kubernetes.objects import (
    ANNOTATION_REVISION,
    annotation_patch,
    ready_endpoint,
    replica_set_body,
    to_workload,
)


def pod(uid: str, *, ready: bool, terminating: bool = False, created: str = "t1") -> dict[str, Any]:
    meta: dict[str, Any] = {
        "uid": uid,
        "creationTimestamp": created,
        "ownerReferences": [{"uid": "rs"}],
    }
    if terminating:
        meta["deletionTimestamp"] = "t9"
    status = {
        "phase": "Running",
        "podIP": f"127.0.3.{len(uid)}",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    return {"metadata": meta, "status": status}


def test_ready_endpoint_ignores_a_terminating_pod_even_if_it_is_ready() -> None:
    old = pod("old", ready=True, terminating=True)
    assert ready_endpoint([old], "rs") is None
    new = pod("newer", ready=False, created="t2")
    assert ready_endpoint([old, new], "rs") is None
    new["status"]["conditions"][0]["status"] = "True"
    endpoint = ready_endpoint([old, new], "rs")
    assert endpoint is not None
    assert endpoint.pod_uid == "newer"
    assert endpoint.port == 49983
    assert ready_endpoint([new], "another-rs") is None  # not owned by this ReplicaSet


def test_replica_set_body_labels_selector_and_env() -> None:
    template = PodTemplates().get("sandbox-base")
    spec = WorkloadSpec(
        name="sbx-1", owner="alice", envs={"FOO": "bar", "HOME": "/home/x"}, access_token="tok"
    )
    body = replica_set_body(spec, template)
    assert body["spec"]["selector"] == {"matchLabels": {LABEL_SANDBOX_ID: "sbx-1"}}
    pod_labels = body["spec"]["template"]["metadata"]["labels"]
    assert pod_labels[LABEL_SANDBOX_ID] == "sbx-1"
    assert pod_labels[LABEL_OWNER] == "alice"
    env = {e["name"]: e["value"] for e in body["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["FOO"] == "bar"
    assert env["HOME"] == "/home/x"  # the sandbox's envs override the template's
    assert env["ENVD_ACCESS_TOKEN"] == "tok"
    assert body["metadata"]["annotations"][ANNOTATION_REVISION] == "1"
    workload = to_workload(V1ReplicaSet.model_validate(body), [])
    assert ANNOTATION_REVISION not in workload.annotations
    assert workload.resource_version == "1"


def test_annotation_patch_tests_the_revision_and_bumps_it() -> None:
    rs = V1ReplicaSet.model_validate(
        {
            "metadata": {"name": "x", "annotations": {ANNOTATION_REVISION: "4", "old": "1"}},
            "spec": {"selector": {}},
        }
    )
    ops = annotation_patch(rs, {"a/b": "v", "old": None, "never-there": None}, "4")
    assert ops[0] == {
        "op": "test",
        "path": "/metadata/annotations/torpor.dev~1revision",
        "value": "4",
    }
    assert {"op": "add", "path": "/metadata/annotations/a~1b", "value": "v"} in ops
    assert {"op": "remove", "path": "/metadata/annotations/old"} in ops
    assert not any(op["path"].endswith("never-there") for op in ops)
    assert ops[-1]["value"] == "5"
    with pytest.raises(ValueError, match="managed by the runtime"):
        annotation_patch(rs, {ANNOTATION_REVISION: "9"}, "4")


def test_templates_from_a_folder_and_from_a_configmap(tmp_path: Path) -> None:
    base = yaml.safe_load((DEFAULT_TEMPLATES / "sandbox-base.yaml").read_text())
    configmap = tmp_path / "templates.yaml"
    configmap.write_text(
        yaml.safe_dump({"kind": "ConfigMap", "data": {"big.yaml": yaml.safe_dump(base)}})
    )
    templates = PodTemplates(configmap, DEFAULT_TEMPLATES)
    assert templates.get("big")["spec"]["containers"][0]["name"] == "envd"
    assert templates.get("sandbox-base")["spec"]["automountServiceAccountToken"] is False
    copy = templates.get("sandbox-base")
    copy["spec"]["containers"].clear()
    assert templates.get("sandbox-base")["spec"]["containers"], "callers must get copies"
    with pytest.raises(NotFound):
        templates.get("missing")
