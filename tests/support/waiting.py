"""Polling a condition from synchronous SDK tests, with a message that says what never happened."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def until(check: Callable[[], Any], within: float, what: str, *, every: float = 0.5) -> Any:
    """Call ``check`` until it returns something truthy (returned), or fail after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {within:.0f}s")
        time.sleep(every)
