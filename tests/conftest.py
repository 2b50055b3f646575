"""Fixtures every test layer shares: a real nats-server (from the wheel) per session, and the
test tiers.

Tiers (markers registered in pyproject.toml): tests in ``UNIT_FOLDERS``, and modules that mark
themselves ``unit``, use in-memory fakes only (``make unit``); every other test is ``e2e`` when it drives the whole system as processes
(the folders in ``E2E_FOLDERS``, or a test using the ``stack`` fixture), else ``integration``.
A unit test that tries to start a process or open a connection fails at once.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # imported by the fixture: nats is not needed by every run (``make unit``)
    from shared.bus.server import EmbeddedNats

# k8s_cluster, k8s_kubelet, k8s_namespace, k8s_runtime; the shared systems (stack, up)
pytest_plugins = ["tests.support.k8s.plugin", "tests.support.fixtures"]

ON_CI = os.environ.get("CI", "").lower() == "true"


def skip_or_fail(reason: str) -> None:
    """Skip on a developer laptop; on CI a missing prerequisite is a failure, never a skip."""
    if ON_CI:
        pytest.fail(f"required on CI: {reason}")
    pytest.skip(reason)


UNIT_FOLDERS = frozenset({"unit", "domain"})
E2E_FOLDERS = frozenset({"e2e", "e2b_sdk", "chaos", "faults", "dashboard", "cli_sandbox"})
TIERS = ("unit", "integration", "e2e")

# Under pytest-xdist (`make pytest` runs two workers, `--dist loadgroup`) every test that uses a
# Kubernetes rig runs on one worker: the rigs are session fixtures, the test kubelet's pods take
# fixed loopback addresses (127.0.3.x) and the real node holds host-wide kube-proxy tables.
K8S_FIXTURES = frozenset(
    {"k8s_cluster", "k8s_kubelet", "k8s_runtime", "k8s_namespace"}
    | {"real_node", "real_runtime", "real_namespace"}
)
K8S_FOLDERS = frozenset({"k8s", "images"})
K8S_MARKERS = ("k8s", "realnode")


def _on_the_node(item: pytest.Item) -> bool:
    if any(item.get_closest_marker(m) for m in K8S_MARKERS):
        return True
    if K8S_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    # parametrized over runtimes: the Kubernetes side takes its rig by getfixturevalue
    parametrized = "[kubernetes" in item.nodeid or "[real-node" in item.nodeid
    return parametrized or item.path.parent.name in K8S_FOLDERS


# Marked as each test is collected, before any pytest_collection_modifyitems (where xdist's worker
# turns the group into its node id's "@node" suffix).
def pytest_itemcollected(item: pytest.Item) -> None:
    if _on_the_node(item):
        item.add_marker(pytest.mark.xdist_group("node"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.get_closest_marker(t) for t in TIERS):
            continue
        folder = item.path.parent.name
        if folder in UNIT_FOLDERS:
            item.add_marker(pytest.mark.unit)
            continue
        e2e = folder in E2E_FOLDERS or "stack" in getattr(item, "fixturenames", ())
        item.add_marker(pytest.mark.e2e if e2e else pytest.mark.integration)


def _forbidden(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a unit test may not {what}: use the fakes in tests/fakes/")

    return refuse


@pytest.fixture(autouse=True)
def _unit_isolation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The unit tier's promise, enforced: no process (so no nats-server), no connection."""
    if request.node.get_closest_marker("unit") is None:
        return
    # Every subprocess (subprocess.Popen, asyncio's create_subprocess_*) goes through this.
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _forbidden("start a process"))
    monkeypatch.setattr(socket.socket, "connect", _forbidden("open a connection"))
    monkeypatch.setattr(socket.socket, "connect_ex", _forbidden("open a connection"))


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    from shared.bus.server import EmbeddedNats

    server = EmbeddedNats(data_dir=tmp_path_factory.mktemp("nats")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def nats_url(nats_server: EmbeddedNats) -> str:
    return nats_server.url


@pytest.fixture
def fresh_nats(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A private server for tests that kill or restart the broker."""
    from shared.bus.server import EmbeddedNats

    server = EmbeddedNats(data_dir=tmp_path / "nats").start()
    yield server
    server.stop()


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[object]:
    import nats

    conn = await nats.connect(nats_url)
    yield conn
    await conn.close()
