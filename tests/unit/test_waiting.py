"""tests.support.waiting.eventually: the bounded wait of the async tests (tests/k8s)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.support import waiting
from tests.support.waiting import eventually

pytestmark = pytest.mark.unit


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    real = asyncio.sleep

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await real(0)

    monkeypatch.setattr(waiting.asyncio, "sleep", sleep)
    return slept


def counter(truthy_after: int) -> tuple[list[int], Any]:
    calls: list[int] = []

    async def check() -> int:
        calls.append(1)
        return len(calls) if len(calls) > truthy_after else 0

    return calls, check


async def test_returns_the_first_truthy_value_sleeping_between_tries(sleeps: list[float]) -> None:
    calls, check = counter(3)
    assert await eventually(check, 120, "never") == 4
    assert len(calls) == 4
    assert sleeps == [0.2, 0.2, 0.2]


async def test_fails_after_timeout_over_every_tries(sleeps: list[float]) -> None:
    calls, check = counter(10_000)
    with pytest.raises(pytest.fail.Exception, match=r"^no warm pod within 120 s$"):
        await eventually(check, 120, "no warm pod within 120 s")
    assert len(calls) == 600
    assert sleeps == [0.2] * 600
    calls, check = counter(10_000)
    with pytest.raises(pytest.fail.Exception):
        await eventually(check, 3, "x", every=0.5)
    assert len(calls) == 6
