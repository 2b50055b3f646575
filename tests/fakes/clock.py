"""A clock tests move by hand: ``clock()`` is "now" (UTC), ``clock.advance(30)`` moves it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class FakeClock:
    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> datetime:
        if seconds < 0:
            msg = "a clock does not go back"
            raise ValueError(msg)
        self._now += timedelta(seconds=seconds)
        return self._now
