"""What moves a sandbox's deadline. The SDK's ``is_running()`` (the daemon's ``/health`` through
the proxy) is no activity: asking whether a sandbox is up neither keeps it up nor moves the
``endAt`` a client just read (E2B's ``test_resume_does_not_shorten_timeout_on_running_sandbox``
compares ``endAt`` around a connect after an ``is_running()``; the probe's background touch
moved it). Every other request through the proxy still is activity, but one seen before a
client's ``set_timeout`` never undoes it (its touch may land after: ``set_timeout(0)`` right
after a file read left the sandbox running for another timeout, about 1 run in 2)."""

from __future__ import annotations

import time

import pytest
from e2b import Sandbox

from tests.support.stack import Stack
from tests.support.waiting import until

pytestmark = pytest.mark.slow

# Longer than a touch takes to land on an idle machine (milliseconds): the old code moved endAt
# within it. A bounded observation, not a timing assertion: a slower touch could only hide it.
OBSERVE_S = 2.0


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


def test_set_timeout_zero_right_after_traffic_expires_now(stack: Stack) -> None:
    """E2B's test_keep_memory_none_defaults_to_full_memory: read a file, ``set_timeout(0)``,
    the sandbox pauses. Three rounds, since the late touch lost the race only about 1 in 2."""
    opts = stack.sdk_opts("alice")
    for _ in range(3):
        s = Sandbox.create(template="base", timeout=120, lifecycle={"on_timeout": "pause"}, **opts)
        try:
            s.files.read("/etc/hostname")
            s.set_timeout(0)
            until(
                lambda s=s: s.get_info().state.value == "paused",  # type: ignore[misc]
                30,
                "the pause after set_timeout(0) right after a file read",
            )
        finally:
            Sandbox.kill(s.sandbox_id, **opts)
