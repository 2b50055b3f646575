"""When a failed webhook delivery is tried again: exponential, capped, jittered."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    base: float = 2.0  # seconds before the 2nd attempt
    cap: float = 600.0  # longest wait between two attempts
    jitter: float = 0.2  # ± this fraction, so receivers that recover are not hit in lockstep

    def delay(self, attempt: int, rand: Callable[[float, float], float] = random.uniform) -> float:
        """The wait after failed attempt ``attempt`` (1 = the first delivery)."""
        exact = min(self.cap, self.base * 2.0 ** max(0, attempt - 1))
        return max(0.0, exact * rand(1 - self.jitter, 1 + self.jitter))

    def schedule(self, attempts: int) -> list[float]:
        """The waits without jitter, for docs and tests: ``[base, 2·base, …]``."""
        return [min(self.cap, self.base * 2.0**i) for i in range(max(0, attempts - 1))]
