"""What an adapter hands the contract suite, and plain-HTTP access to a pod's daemon."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from shared.ports.runtime import Runtime
from shared.ports.workloads import Endpoint


@dataclass
class HarnessContext:
    nats_url: str
    tmp_path: Path
    request: pytest.FixtureRequest


@dataclass
class RuntimeHarness:
    runtime: Runtime
    never_ready_template: str  # a template whose pod starts but never becomes ready
    ready_timeout: float = 30.0


RuntimeFactory = Callable[[], AbstractAsyncContextManager[RuntimeHarness]]


async def write_file(ep: Endpoint, path: str, data: bytes) -> None:
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        r = await client.post(
            f"{ep.base_url}/files", params={"path": path}, files={"file": ("f", data)}
        )
        assert r.status_code == 200, r.text


async def read_file(ep: Endpoint, path: str) -> bytes | None:
    """The file's bytes, or ``None`` when the daemon says it does not exist."""
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        r = await client.get(f"{ep.base_url}/files", params={"path": path})
    if r.status_code == 404:
        return None
    assert r.status_code == 200, r.text
    return r.content


async def healthy(ep: Endpoint) -> bool:
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=2) as client:
            return (await client.get(f"{ep.base_url}/health")).is_success
    except httpx.HTTPError:
        return False
