"""Fixtures of tests/security. The security tests that need real sandboxes use the shared stack
(``stack``, tests/support/fixtures.py; quotas are set per user in the tests themselves); the bus
and secrets tests use real ``torpor up`` instances of their own (temp data dir, free ports),
being about what ``torpor up`` itself sets up."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import skip_or_fail
from tests.dashboard.upstack import Up, need_up, torpor_up
from tests.security.embedded import EmbeddedBus, placeholder_up
from tests.security.network_support import outside_host

__all__ = ["outside_host"]  # the pod network tests' fixture


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
