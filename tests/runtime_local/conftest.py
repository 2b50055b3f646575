"""Fixtures for the local runtime's own tests: a factory of LocalRuntimes sharing one data dir."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shared.runtime.local import LocalRuntime
from tests.conftest import skip_or_fail
from tests.runtime_local.support import LocalRuntimeFactory, runtime_kwargs
from tests.support.pods import release_pods


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "local-runtime"


@pytest.fixture
def bucket() -> str:
    return f"wl_{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def local_runtime(
    nats_url: str, data_dir: Path, bucket: str
) -> AsyncIterator[LocalRuntimeFactory]:
    """Start LocalRuntimes on demand (default: this test's data dir and bucket); all are closed
    at the end of the test."""
    if shutil.which("bwrap") is None:
        skip_or_fail("bubblewrap (bwrap) is not installed")
    started: list[LocalRuntime] = []

    async def start(**overrides: Any) -> LocalRuntime:
        runtime = LocalRuntime(**{**runtime_kwargs(nats_url, data_dir, bucket), **overrides})
        started.append(await runtime.start())
        return runtime

    try:
        yield start
    finally:
        for runtime in reversed(started):
            await runtime.close()
        await release_pods(data_dir)  # the safety net for failed tests
