"""Fixtures every test layer shares: a real nats-server (from the wheel) per session."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from shared.bus.server import EmbeddedNats

pytest_plugins = ["tests.k8s.plugin"]  # k8s_cluster, k8s_kubelet, k8s_namespace, k8s_runtime

ON_CI = os.environ.get("CI", "").lower() == "true"


def skip_or_fail(reason: str) -> None:
    """Skip on a developer laptop; on CI a missing prerequisite is a failure, never a skip."""
    if ON_CI:
        pytest.fail(f"required on CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(data_dir=tmp_path_factory.mktemp("nats")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def nats_url(nats_server: EmbeddedNats) -> str:
    return nats_server.url


@pytest.fixture
def fresh_nats(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A private server for tests that kill or restart the broker."""
    server = EmbeddedNats(data_dir=tmp_path / "nats").start()
    yield server
    server.stop()


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[object]:
    import nats

    conn = await nats.connect(nats_url)
    yield conn
    await conn.close()
