"""The contract suite runs once per runtime adapter.

``ADAPTERS`` maps an adapter name to a module whose ``harness(context)`` async context manager
yields a :class:`tests.contract.harness.RuntimeHarness`. Adding an adapter is one line here plus
its module under ``tests/contract/adapters/``.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.contract.harness import HarnessContext, RuntimeFactory, RuntimeHarness

ADAPTERS: dict[str, str] = {
    "kubernetes": "tests.contract.adapters.kubernetes",
    "local": "tests.contract.adapters.local",
}


@pytest.fixture(params=sorted(ADAPTERS))
def runtime_factory(
    request: pytest.FixtureRequest, nats_url: str, tmp_path: Path
) -> RuntimeFactory:
    module = importlib.import_module(ADAPTERS[request.param])
    context = HarnessContext(nats_url=nats_url, tmp_path=tmp_path, request=request)
    return lambda: module.harness(context)  # type: ignore[no-any-return]


@pytest.fixture
async def runtime(runtime_factory: RuntimeFactory) -> AsyncIterator[RuntimeHarness]:
    async with runtime_factory() as harness:
        yield harness
