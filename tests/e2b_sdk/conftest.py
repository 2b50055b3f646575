"""The unmodified ``e2b`` SDK against the shared real stack (``stack``, tests/support/fixtures.py:
nats-server and the five services on the local runtime), as in ``tests/e2e``."""

from __future__ import annotations

import pytest

from tests.support.stack import Stack


@pytest.fixture(scope="session")
def opts(stack: Stack) -> dict[str, object]:
    return stack.sdk_opts("alice")
