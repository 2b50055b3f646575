"""Settings and helpers shared by the local runtime's tests and the owner subprocess they start."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from shared.ports.workloads import Endpoint, WorkloadSpec
from shared.runtime.local import LocalRuntime

TEMPLATES: Path | None = None  # the packaged templates: sandbox-base runs the real daemon

LocalRuntimeFactory = Callable[..., Awaitable[LocalRuntime]]


def new_name() -> str:
    return f"sbx-{uuid.uuid4().hex[:10]}"


async def started(
    rt: LocalRuntime, template: str = "sandbox-base", *, timeout: float = 30.0
) -> tuple[str, Endpoint]:
    """A new workload of alice's from ``template``, created and ready: its name and endpoint."""
    name = new_name()
    await rt.create(WorkloadSpec(name=name, owner="alice", template=template))
    return name, await rt.wait_ready(name, timeout=timeout)


def runtime_kwargs(nats_url: str, data_dir: Path, bucket: str) -> dict[str, Any]:
    return {
        "nats_url": nats_url,
        "data_dir": data_dir,
        "bucket": bucket,
        "templates_dir": TEMPLATES,
        "stop_grace": 1.0,
        "poll_interval": 0.2,
    }


def start_owner(
    nats_url: str, data_dir: Path, bucket: str, names: list[str]
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """owner_process.py owning ``names``: the process, once it printed its pods' endpoints."""
    script = Path(__file__).with_name("owner_process.py")
    argv = [
        sys.executable,
        str(script),
        "--nats-url",
        nats_url,
        "--data-dir",
        str(data_dir),
        "--bucket",
        bucket,
    ]
    if TEMPLATES is not None:
        argv += ["--templates-dir", str(TEMPLATES)]
    for name in names:
        argv += ["--name", name]
    owner = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert owner.stdout is not None
    for line in owner.stdout:
        if line.startswith("ENDPOINTS "):
            return owner, json.loads(line.removeprefix("ENDPOINTS "))
    pytest.fail(f"owner exited with {owner.wait(10)} before its pods were ready")
