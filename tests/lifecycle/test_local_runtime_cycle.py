"""The seed's Pause & Resume cycle end to end on the real parts: NATS, the local runtime (pods
under bubblewrap), the in-sandbox daemon, the envd client, and the snapshotter and scaler wired
exactly as in production (in-process)."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shared.domain.states import SandboxState
from shared.envd.client import ConnectEnvdClient
from shared.errors import IllegalTransition, NotFound
from shared.models.snapshots import ProcessConfig
from shared.ports.lifecycle import CreateRequest
from shared.ports.workloads import ANNOTATION_SNAPSHOT, Endpoint
from shared.runtime.local import LocalRuntime
from tests.conftest import skip_or_fail
from tests.lifecycle.harness import System, pause_to_zero, running_system

COMMAND = "date +%s%N >> started.log; exec sleep 1000"


@pytest.fixture
async def system(fresh_nats, tmp_path: Path) -> AsyncIterator[System]:  # type: ignore[no-untyped-def]
    if shutil.which("bwrap") is None:
        skip_or_fail("bubblewrap (bwrap) is not installed")
    runtime = LocalRuntime(
        nats_url=fresh_nats.url,
        data_dir=tmp_path / "rt",
        bucket=f"wl_{uuid.uuid4().hex[:8]}",
        stop_grace=1.0,
    )
    await runtime.start()
    envd = ConnectEnvdClient()
    try:
        async with running_system(fresh_nats.url, runtime, envd) as s:
            yield s
    finally:
        await envd.close()
        await runtime.close()


async def _lines(path: Path) -> list[str]:
    """The file's lines once the process has written them (pods are real: allow a moment)."""
    for _ in range(200):
        if path.exists() and path.read_text().strip():
            break
        await asyncio.sleep(0.05)
    return path.read_text().split()


def _workspace(tmp_path: Path, pod_uid: str) -> Path:
    return tmp_path / "rt" / "pods" / pod_uid / "root" / "workspace"


@pytest.mark.slow
async def test_seed_cycle_on_local_runtime(system: System, tmp_path: Path) -> None:
    rec = await system.lifecycle.create(
        CreateRequest(owner="alice", sandbox_id="sbx-local"), wait=60
    )
    assert rec.state == SandboxState.RUNNING
    assert rec.host is not None
    assert rec.pod_uid is not None
    first = Endpoint(host=rec.host, pod_uid=rec.pod_uid)
    config = ProcessConfig(cmd="/bin/bash", args=["-l", "-c", COMMAND], cwd="/workspace")
    pid = await system.envd.start_process(
        first, config, tag=None, access_token=rec.envd_access_token
    )
    log_before = _workspace(tmp_path, rec.pod_uid) / "started.log"
    first_start = await _lines(log_before)
    assert len(first_start) == 1

    paused, workload = await pause_to_zero(system, "sbx-local", wait=60)
    assert not await system.envd.health(first, timeout=1)  # the pod is gone...
    assert not (tmp_path / "rt" / "pods" / rec.pod_uid).exists()  # ...and its folder
    kept = tmp_path / "rt" / "layers" / "sbx-local" / "mnt"
    assert not kept.exists() or not any(kept.iterdir()), "a paused sandbox's layer stays mounted"
    assert (tmp_path / "rt" / "layers" / "sbx-local" / "disk.img").is_file()  # ...kept
    doc = json.loads(base64.b64decode(workload.annotations[ANNOTATION_SNAPSHOT]))
    assert doc["captured_time"].endswith("Z")
    # Exactly the seed's shape: optional keys (envs, tag) are omitted, not null.
    assert doc["processes"] == [
        {
            "config": {"cmd": "/bin/bash", "args": ["-l", "-c", COMMAND], "cwd": "/workspace"},
            "pid": pid,
        }
    ]
    assert list(doc) == ["captured_time", "processes"]
    with pytest.raises(IllegalTransition):
        await system.lifecycle.pause("sbx-local", owner="alice", wait=5)

    result = await system.lifecycle.resume("sbx-local", owner="alice", wait=60)
    assert result.resumed
    again = result.record
    assert again.state == SandboxState.RUNNING
    assert again.pod_uid is not None
    assert again.pod_uid != rec.pod_uid
    assert again.host is not None
    second = Endpoint(host=again.host, pod_uid=again.pod_uid)
    live = await system.envd.list_processes(second, access_token=again.envd_access_token)
    assert [(p.config.cmd, p.config.args, p.config.cwd) for p in live] == [
        ("/bin/bash", ["-l", "-c", COMMAND], "/workspace")
    ]
    log_after = _workspace(tmp_path, again.pod_uid) / "started.log"
    second_start = await _lines(log_after)
    # /workspace was kept (the line from before the pause is still there) and the process
    # started anew (a second, later line).
    for _ in range(100):
        if len(second_start) == 2:
            break
        await asyncio.sleep(0.05)
        second_start = await _lines(log_after)
    assert second_start[0] == first_start[0]
    assert len(second_start) == 2
    assert int(second_start[1]) > int(first_start[0])
    # The annotation (and the record) still show the last snapshot.
    workload = await system.runtime.get("sbx-local")
    assert workload is not None
    assert workload.annotations[ANNOTATION_SNAPSHOT] == paused.snapshot.annotation  # type: ignore[union-attr]
    assert (await system.lifecycle.get("sbx-local", owner="alice")).snapshot == paused.snapshot

    await system.lifecycle.kill("sbx-local", owner="alice", wait=30)
    assert await system.runtime.get("sbx-local") is None
    with pytest.raises(NotFound):
        await system.lifecycle.get("sbx-local", owner="alice")
