"""Durations of consecutive phases of one operation, in ms, for its timing log line (the
``create_timing``/``resume_timing`` lines of the scaler, the runtime's claim and ready lines):
``bench/claim_breakdown.py`` turns them into a per-stage breakdown."""

from __future__ import annotations

import time


class Spans:
    """Each ``mark(phase)`` ends the phase that began at the previous mark (or at the start)."""

    def __init__(self, started: float | None = None) -> None:
        self._started = time.monotonic() if started is None else started
        self._last = self._started
        self._ms: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        now = time.monotonic()
        key = f"{phase}_ms"
        # A phase marked twice (a loop) adds up.
        self._ms[key] = round(self._ms.get(key, 0.0) + (now - self._last) * 1000, 1)
        self._last = now

    def as_ms(self) -> dict[str, float]:
        return {**self._ms, "total_ms": round((self._last - self._started) * 1000, 1)}

    def of(self, *phases: str) -> float:
        return round(sum(self._ms.get(f"{p}_ms", 0.0) for p in phases), 1)
