"""Polling a condition, with a message that says what never happened: ``until`` from synchronous
SDK tests, ``eventually`` from async ones."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest


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


async def eventually(
    check: Callable[[], Awaitable[Any]], timeout: float, failure: str, *, every: float = 0.2
) -> Any:
    """Await ``check`` until it returns something truthy (returned): ``timeout / every`` tries,
    ``every`` s apart, so at least ``timeout`` s of waiting however long a try takes; then the
    test fails with ``failure``."""
    for _ in range(round(timeout / every)):
        if value := await check():
            return value
        await asyncio.sleep(every)
    pytest.fail(failure)
