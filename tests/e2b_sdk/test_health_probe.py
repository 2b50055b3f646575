"""The SDK's ``is_running()`` (the daemon's ``/health`` through the proxy) is no activity: asking
whether a sandbox is up neither keeps it up nor moves the ``endAt`` a client just read (E2B's
``test_resume_does_not_shorten_timeout_on_running_sandbox`` compares ``endAt`` around a
connect after an ``is_running()``; torpor's inactivity timeout moved it by the probe's
background touch). Every other request through the proxy still is activity."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from e2b import Sandbox

from tests.support.stack import Stack
from tests.support.waiting import until

pytestmark = pytest.mark.slow

# Longer than a touch takes to land on an idle machine (milliseconds): the old code moved endAt
# within it. A bounded observation, not a timing assertion: a slower touch could only hide it.
OBSERVE_S = 2.0


@pytest.fixture(scope="module")
def sbx(stack: Stack) -> Iterator[Sandbox]:
    opts = stack.sdk_opts("alice")
    s = Sandbox.create(template="base", timeout=300, **opts)
    yield s
    Sandbox.kill(s.sandbox_id, **opts)


def test_is_running_does_not_move_end_at_but_traffic_does(sbx: Sandbox) -> None:
    end_at = sbx.get_info().end_at
    observed_until = time.monotonic() + OBSERVE_S
    while time.monotonic() < observed_until:
        assert sbx.is_running()
        assert sbx.get_info().end_at == end_at
    # A real request does count (so the check above is not vacuous): the touch lands soon.
    until(
        lambda: sbx.files.list("/home/user") is not None and sbx.get_info().end_at > end_at,
        30,
        "a file listing moving endAt",
    )
