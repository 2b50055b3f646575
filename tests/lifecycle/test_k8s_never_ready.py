"""A template whose ready command never succeeds, on the kubernetes adapter (test kubelet, the
real scaler and snapshotter on a real nats-server): the create fails with the ready command's
exit code and output, not a 504 "still in progress"; a resume fails back to ``paused`` with its
snapshot intact (and resumes once the template is mended), never retrying forever."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml

from shared.bus import subjects
from shared.bus.topology import STREAM_EVT
from shared.domain.states import SandboxState
from shared.envd.client import ConnectEnvdClient
from shared.errors import RuntimeFailure
from shared.ports.lifecycle import CreateRequest
from shared.ports.workloads import ANNOTATION_SNAPSHOT
from shared.runtime.kubernetes import DEFAULT_TEMPLATES, KubernetesRuntime, PodTemplates
from tests.lifecycle.harness import System, running_system
from tests.support.k8s.kubelet import TestKubelet
from tests.support.k8s.rig import ClusterAccess

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.timeout(300)]

TEMPLATE = "sandbox-with-ready-cmd"
NEVER = "echo not yet; exit 3"
# Long enough for a loaded machine's daemon start (a slow start is retried, not failed).
READY_TIMEOUT = 12.0


def write_template(folder: Path, ready_cmd: str) -> None:
    """``sandbox-base`` with a ready command, as a built template's pod template carries it."""
    document: dict[str, Any] = yaml.safe_load((DEFAULT_TEMPLATES / "sandbox-base.yaml").read_text())
    document["metadata"]["name"] = TEMPLATE
    daemon = document["template"]["spec"]["containers"][0]
    daemon["env"] = [
        *copy.deepcopy(daemon["env"]),
        {"name": "TORPOR_READY_CMD", "value": ready_cmd},
    ]
    (folder / f"{TEMPLATE}.yaml").write_text(yaml.safe_dump(document))


@pytest.fixture
async def system(
    tmp_path: Path,
    fresh_nats,  # type: ignore[no-untyped-def]
    k8s_cluster: ClusterAccess,
    k8s_kubelet: TestKubelet,
    k8s_namespace: str,
) -> AsyncIterator[tuple[System, Path]]:
    write_template(tmp_path, "true")
    runtime = await KubernetesRuntime.from_kubeconfig(
        Path(k8s_cluster.kubeconfig),
        namespace=k8s_namespace,
        templates=PodTemplates(tmp_path, DEFAULT_TEMPLATES),
    )
    envd = ConnectEnvdClient()
    try:
        async with running_system(fresh_nats.url, runtime, envd, ready_timeout=READY_TIMEOUT) as s:
            yield s, tmp_path
    finally:
        await envd.close()
        await runtime.close()


async def last_failed_event(nats_url: str, sandbox_id: str) -> dict[str, Any]:
    nc = await nats.connect(nats_url)
    try:
        msg = await nc.jetstream().get_last_msg(
            STREAM_EVT, subjects.of(subjects.EVT_FAILED, sandbox_id)
        )
        data: dict[str, Any] = json.loads(msg.data)
        return data
    finally:
        await nc.close()


async def test_a_never_ready_create_fails_with_the_ready_commands_output(
    system: tuple[System, Path],
    fresh_nats,  # type: ignore[no-untyped-def]
) -> None:
    s, folder = system
    write_template(folder, NEVER)
    with pytest.raises(RuntimeFailure) as failed:
        await s.lifecycle.create(
            CreateRequest(owner="alice", sandbox_id="sbx-unready", template=TEMPLATE), wait=120
        )
    assert "ready command failed: exit 3: not yet" in str(failed.value)
    record = await s.store.get("sbx-unready")
    assert record is not None and record.state == SandboxState.FAILED
    assert record.failure is not None and "exit 3: not yet" in record.failure
    event = await last_failed_event(fresh_nats.url, "sbx-unready")
    assert event["op"] == "create" and "exit 3: not yet" in event["reason"]
    assert await s.runtime.get("sbx-unready") is None  # deleted, its pods gone (the port)


async def test_a_never_ready_resume_stays_paused_with_its_snapshot(
    system: tuple[System, Path],
    fresh_nats,  # type: ignore[no-untyped-def]
) -> None:
    s, folder = system
    sid = "sbx-unready-resume"
    created = await s.lifecycle.create(
        CreateRequest(owner="alice", sandbox_id=sid, template=TEMPLATE), wait=120
    )
    assert created.state == SandboxState.RUNNING
    paused = await s.lifecycle.pause(sid, owner="alice", wait=120)
    assert paused.snapshot is not None

    write_template(folder, NEVER)  # the template changed: a resume renders it as it is now
    with pytest.raises(RuntimeFailure) as failed:
        await s.lifecycle.resume(sid, owner="alice", wait=120)
    assert "ready command failed: exit 3: not yet" in str(failed.value)
    after = await s.store.get(sid)
    assert after is not None
    assert after.state == SandboxState.PAUSED
    assert after.snapshot == paused.snapshot
    assert after.generation > paused.generation
    assert after.failure is not None and "exit 3: not yet" in after.failure
    event = await last_failed_event(fresh_nats.url, sid)
    assert event["op"] == "resume" and "exit 3: not yet" in event["reason"]
    workload = await s.runtime.get(sid)
    assert workload is not None and workload.replicas == 0 and workload.pod_uid is None
    assert workload.annotations[ANNOTATION_SNAPSHOT] == paused.snapshot.annotation

    write_template(folder, "true")  # mended: the same snapshot resumes
    result = await s.lifecycle.resume(sid, owner="alice", wait=120)
    assert result.resumed and result.record.state == SandboxState.RUNNING
    assert result.record.failure is None
    await s.lifecycle.kill(sid, owner="alice", wait=60)
