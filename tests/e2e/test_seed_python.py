"""Done criterion: the seed's example, verbatim, with the unmodified e2b SDK against the real
system (NATS + api + proxy + scheduler + snapshotter + scaler, local runtime)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.stack import Stack

pytestmark = pytest.mark.slow

SEED_CMD = "PYTHONPATH=/workspace/pylibs PATH=/workspace/npm/bin:$PATH python3 server.py > service.log 2>&1"


def test_seed_example_verbatim(stack: Stack) -> None:
    script = Path(__file__).with_name("seed_example.py")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("E2B_")}, **stack.sdk_env()}
    done = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, (
        f"{done.stdout}\n{done.stderr}\n--- logs\n{stack.all_logs()[-6000:]}"
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["pause_status"] == 200
    assert result["state_at_pause"] == "paused"
    processes = result["snapshot"]["processes"]
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z", result["snapshot"]["captured_time"]
    )
    server = [p for p in processes if p["config"]["args"][-1] == SEED_CMD]
    assert len(server) == 1, processes
    assert server[0]["config"]["cmd"] == "/bin/bash"
    assert server[0]["config"]["args"] == ["-l", "-c", SEED_CMD]
    assert server[0]["config"]["cwd"] == "/workspace"
    # Replayed: a brand-new process (new boot id; the PID number itself may repeat, since each
    # pod has a fresh PID namespace).
    before = re.search(r"pid=(\d+) boot=(\w+)", result["before"])
    after = re.search(r"pid=(\d+) boot=(\w+)", result["after"])
    assert before, result
    assert after, result
    assert before.group(2) != after.group(2)
    assert result["state_after"] == "running"
    assert result["snapshot_after"]  # metadata.snapshot keeps the last pause's JSON
