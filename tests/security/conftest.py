"""Fixtures of tests/security. One real torpor stack (nats-server + the five services on the
local runtime) shared by the security tests that need real sandboxes (quotas are set per user in
the tests themselves); and real ``torpor up`` instances (temp data dir, free ports) for the bus
and secrets tests, which are about what ``torpor up`` itself sets up."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import skip_or_fail
from tests.dashboard.upstack import Up, need_up, torpor_up
from tests.e2e.stack import Stack, need_bwrap, running_stack
from tests.security.embedded import EmbeddedBus, placeholder_up
from tests.security.network_support import outside_host

__all__ = ["outside_host"]  # the pod network tests' fixture


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if reason := need_bwrap():
        skip_or_fail(reason)
    try:
        with running_stack(tmp_path_factory.mktemp("security")) as s:
            yield s
    except RuntimeError as e:
        skip_or_fail(f"the torpor stack did not start: {e}")


@pytest.fixture(scope="session")
def placeholder_bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBus]:
    """The bus of a ``torpor up`` whose services are placeholders (no runtime needed)."""
    with placeholder_up(tmp_path_factory.mktemp("bus-auth")) as bus:
        yield bus


@pytest.fixture(scope="session")
def full_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """A complete ``torpor up`` (local runtime: bubblewrap), logging as a user's would
    (console format, whose default tracebacks used to print every frame's locals)."""
    if reason := need_up():
        skip_or_fail(reason)
    with torpor_up(tmp_path_factory.mktemp("secrets"), TORPOR_LOG_FORMAT="console") as running:
        yield running
