"""The seed scenario with the unmodified JavaScript SDK (``e2b`` from npm) on Node.js:
create → background process → pause → connect → kill. The package is installed on first use
into ~/.cache/torpor/npm (outside the repository)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import skip_or_fail
from tests.support.stack import Stack

pytestmark = [pytest.mark.slow, pytest.mark.node]

NPM_DIR = Path.home() / ".cache" / "torpor" / "npm"


def _e2b_js() -> Path:
    if not shutil.which("node") or not shutil.which("npm"):
        skip_or_fail("Node.js/npm are not installed")
    if not (NPM_DIR / "node_modules" / "e2b" / "package.json").exists():
        NPM_DIR.mkdir(parents=True, exist_ok=True)
        if not (NPM_DIR / "package.json").exists():
            (NPM_DIR / "package.json").write_text('{"name": "torpor-e2e-js", "private": true}\n')
        done = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "e2b@^2"],
            cwd=NPM_DIR,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            skip_or_fail(f"npm install e2b failed: {done.stderr[-500:]}")
    return NPM_DIR / "node_modules"


def test_js_sdk_pause_connect_kill(stack: Stack) -> None:
    modules = _e2b_js()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("E2B_")}, **stack.sdk_env()}
    env["NODE_PATH"] = str(modules)
    script = Path(__file__).with_name("js_scenario.cjs")
    done = subprocess.run(
        ["node", str(script)], env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["state"] == "paused"
    (proc,) = [p for p in result["snapshot"]["processes"] if "server.py" in p["config"]["args"][-1]]
    assert proc["config"]["cmd"] == "/bin/bash"
    assert proc["config"]["cwd"] == "/workspace"
    # A new process: its boot id differs. (Its PID may repeat: each pod has a fresh PID namespace.)
    boots = [re.search(r"pid=\d+ boot=(\w+)", result[k]) for k in ("before", "after")]
    assert all(boots)
    assert boots[0].group(1) != boots[1].group(1)
    assert "server.py started" in result["tail"]
    assert result["gone"] is True
