"""Session fixtures for suites that can share one running system (loaded by tests/conftest.py).

``stack``: the services as processes on the local runtime with the e2e seed template; used by
tests/e2e, tests/e2b_sdk and tests/security, which only create their own sandboxes with their own
keys. ``up``: ``torpor up`` (alice pauses, bob does not), used by tests/dashboard and
tests/cli_sandbox. Tests that kill services, restart the bus or need other settings start their
own ``Stack``."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.conftest import skip_or_fail

# tests.support.stack is imported by the fixtures: every pytest run (``make unit`` too) loads this
# plugin, and the stack's imports (the CLI, the local runtime) cost seconds.
if TYPE_CHECKING:
    from tests.support.stack import Stack


def need_bwrap() -> None:
    if shutil.which("bwrap") is None:
        skip_or_fail("bubblewrap (bwrap) is not installed")


def started(stack: Stack) -> Iterator[Stack]:
    """``stack`` running for the duration of a fixture; one that does not start skips (off CI)."""
    from tests.support.stack import StackDidNotStart

    need_bwrap()
    try:
        with stack.running() as running:
            yield running
    except StackDidNotStart as e:
        skip_or_fail(f"the torpor stack did not start: {e}")


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from tests.support.stack import SEED_TEMPLATE, Stack

    yield from started(
        Stack(tmp_path_factory.mktemp("stack"), templates={"sandbox-base": SEED_TEMPLATE})
    )


@pytest.fixture(scope="session")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from tests.support.stack import Stack

    yield from started(Stack.up(tmp_path_factory.mktemp("up")))
