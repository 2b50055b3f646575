"""Concurrent exchanges per upstream (host, port), taken without awaiting when one is free.

Why not ``asyncio.Semaphore``: the relay (``services.proxy.relay``) runs from protocol
callbacks, where it cannot ``await``; it takes a free slot synchronously and only the rare
request that must queue goes through a coroutine. Waiters are served first come, first served.
"""

from __future__ import annotations

import asyncio
import collections
from types import TracebackType


class ExchangeSlots:
    def __init__(self, limit: int) -> None:
        self._free = limit
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def try_take(self) -> bool:
        """Take a slot if one is free and nobody is queued before us."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    async def take(self) -> None:
        if self.try_take():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # ``give`` hands its slot straight to us
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed a slot as we were cancelled: pass it on
            else:
                self._waiters.remove(waiter)
            raise

    def give(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    async def __aenter__(self) -> None:
        await self.take()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.give()
