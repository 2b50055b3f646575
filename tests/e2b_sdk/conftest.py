"""The unmodified ``e2b`` SDK against the shared real stack (``stack``, tests/support/fixtures.py:
nats-server and the five services on the local runtime), as in ``tests/e2e``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import Sandbox

from tests.support.stack import Stack


@pytest.fixture(scope="session")
def opts(stack: Stack) -> dict[str, object]:
    return stack.sdk_opts("alice")


@pytest.fixture(scope="module")
def sbx(opts: dict[str, object]) -> Iterator[Sandbox]:
    """One of alice's base sandboxes for a module's tests (a module may define its own)."""
    s = Sandbox.create(template="base", timeout=300, **opts)  # type: ignore[arg-type]
    yield s
    Sandbox.kill(s.sandbox_id, **opts)  # type: ignore[arg-type]
