"""The seed's Pause & Resume cycle on the kubernetes adapter: a real kube-apiserver and
controller-manager (ReplicaSets, the scale subresource), on two nodes: the test kubelet running
each pod's daemon on 127.0.0.N, and the real node (kubelet + containerd, sandbox-base image,
marker ``realnode``). Skips on a laptop without them; required on CI."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator

import pytest

from shared.domain.states import SandboxState
from shared.envd.client import ConnectEnvdClient
from shared.models.snapshots import ProcessConfig
from shared.ports.lifecycle import CreateRequest
from shared.ports.workloads import ANNOTATION_SNAPSHOT, Endpoint
from shared.runtime.kubernetes import KubernetesRuntime
from tests.lifecycle.harness import System, pause_to_zero, running_system

COMMAND = "echo started >> started.log; exec sleep 1000"

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


@pytest.fixture(
    params=[
        "test-kubelet",
        # 1200 s: the real node's session fixture may rebuild the images, then starts the node
        pytest.param("real-node", marks=[pytest.mark.realnode, pytest.mark.timeout(1200)]),
    ]
)
def node_runtime(request: pytest.FixtureRequest) -> KubernetesRuntime:
    """The adapter on the test kubelet or on the real node (a sync fixture: it may set up
    either backend's async fixtures)."""
    name = "k8s_runtime" if request.param == "test-kubelet" else "real_runtime"
    runtime: KubernetesRuntime = request.getfixturevalue(name)
    return runtime


@pytest.fixture
async def system(fresh_nats, node_runtime: KubernetesRuntime) -> AsyncIterator[System]:  # type: ignore[no-untyped-def]
    runtime = node_runtime
    envd = ConnectEnvdClient()
    try:
        async with running_system(fresh_nats.url, runtime, envd, ready_timeout=180) as s:
            yield s
    finally:
        await envd.close()


async def test_seed_cycle_on_kubernetes(system: System) -> None:
    rec = await system.lifecycle.create(
        CreateRequest(owner="alice", sandbox_id="sbx-k8s"), wait=120
    )
    assert rec.state == SandboxState.RUNNING
    assert rec.host is not None
    assert rec.pod_uid is not None
    config = ProcessConfig(cmd="/bin/bash", args=["-l", "-c", COMMAND], cwd="/workspace")
    pid = await system.envd.start_process(
        Endpoint(host=rec.host, pod_uid=rec.pod_uid),
        config,
        tag=None,
        access_token=rec.envd_access_token,
    )

    paused, rs = await pause_to_zero(system, "sbx-k8s", wait=120)
    doc = json.loads(base64.b64decode(rs.annotations[ANNOTATION_SNAPSHOT]))
    assert [(p["config"]["args"], p["pid"]) for p in doc["processes"]] == [
        (["-l", "-c", COMMAND], pid)
    ]

    result = await system.lifecycle.resume("sbx-k8s", owner="alice", wait=120)
    again = result.record
    assert result.resumed
    assert again.state == SandboxState.RUNNING
    assert again.pod_uid is not None
    assert again.pod_uid != rec.pod_uid  # a new pod, not the terminating one
    assert again.host is not None
    live = await system.envd.list_processes(
        Endpoint(host=again.host, pod_uid=again.pod_uid), access_token=again.envd_access_token
    )
    assert [(p.config.cmd, p.config.args) for p in live] == [("/bin/bash", ["-l", "-c", COMMAND])]
    rs = await system.runtime.get("sbx-k8s")
    assert rs is not None
    assert rs.annotations[ANNOTATION_SNAPSHOT] == paused.snapshot.annotation  # type: ignore[union-attr]

    await system.lifecycle.kill("sbx-k8s", owner="alice", wait=60)
    assert await system.runtime.get("sbx-k8s") is None
