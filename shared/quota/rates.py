"""Token buckets per (action, user) in a compare-and-set bucket, so every API and proxy replica
draws from the same tokens. A bucket holds ``burst`` tokens and refills at ``per_minute``; an
absent key is a full bucket (the KV bucket's TTL drops idle ones)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable

from shared.errors import Conflict, QuotaExceeded
from shared.quota.ports import CasBucket

_ATTEMPTS = 16
Clock = Callable[[], float]


class RateLimiter:
    def __init__(self, bucket: CasBucket, *, clock: Clock = time.time) -> None:
        self._bucket = bucket
        self._clock = clock

    async def take(self, action: str, user: str, *, per_minute: float, burst: int) -> None:
        """Spend one token; ``QuotaExceeded`` (with the wait until the next one) if none is left.
        ``per_minute == 0`` means unlimited."""
        if per_minute <= 0:
            return
        key = f"{action}.{user}"
        for _ in range(_ATTEMPTS):
            now = self._clock()
            found = await self._bucket.entry(key)
            tokens = float(burst)
            if found is not None:
                state = json.loads(found[0])
                elapsed = max(0.0, now - float(state["at"]))
                tokens = min(float(burst), float(state["tokens"]) + elapsed * per_minute / 60)
            if tokens < 1:
                wait = math.ceil((1 - tokens) * 60 / per_minute)
                msg = f"rate limit: at most {per_minute:g} {action}s per minute; retry in {wait}s"
                raise QuotaExceeded(msg, retry_after=max(1, wait), retryable=True)
            value = json.dumps({"tokens": tokens - 1, "at": now}).encode()
            try:
                if found is None:
                    await self._bucket.create(key, value)
                else:
                    await self._bucket.update(key, value, last=found[1])
            except Conflict:
                await asyncio.sleep(0)  # another replica spent a token meanwhile: re-read
                continue
            return
        msg = f"rate limit: too much contention on {action}s of {user}"
        raise QuotaExceeded(msg, retry_after=1, retryable=True)
