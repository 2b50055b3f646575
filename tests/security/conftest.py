"""Fixtures of tests/security. The security tests that need real sandboxes use the shared stack
(``stack``, tests/support/fixtures.py; quotas are set per user in the tests themselves); the bus
and secrets tests use real ``torpor up`` instances of their own (temp data dir, free ports),
being about what ``torpor up`` itself sets up."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.security.embedded import EmbeddedBus, placeholder_up
from tests.security.network_support import outside_host
from tests.support.fixtures import need_bwrap
from tests.support.stack import Stack

__all__ = ["outside_host"]  # the pod network tests' fixture


@pytest.fixture(scope="session")
def placeholder_bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBus]:
    """The bus of a ``torpor up`` whose services are placeholders (no runtime needed)."""
    with placeholder_up(tmp_path_factory.mktemp("bus-auth")) as bus:
        yield bus


@pytest.fixture(scope="session")
def full_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A complete ``torpor up`` (local runtime: bubblewrap), logging as a user's would
    (console format, whose default tracebacks used to print every frame's locals)."""
    need_bwrap()
    with Stack.up(tmp_path_factory.mktemp("secrets"), TORPOR_LOG_FORMAT="console").running() as up:
        yield up
