"""``Publisher`` that records what was published and de-duplicates message ids like JetStream.

JetStream drops a publish whose ``Nats-Msg-Id`` it stored within the stream's duplicate window
(10 min in ``shared.bus.topology``) and answers with ``duplicate``: the fake returns ``False`` for
it and does not record it again. ``deliver`` (optional) hands each stored message on, e.g. to a
FastStream ``TestNatsBroker`` so handlers run as if the bus had delivered it; each delivery runs
in its own task like a JetStream delivery (``await publisher.drain()`` waits for all of them).
``fail_with`` makes the next publish raise (the bus is down).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

Deliver = Callable[["Published"], Awaitable[Any]]


@dataclass(frozen=True)
class Published:
    subject: str
    message: BaseModel
    msg_id: str

    @property
    def verb(self) -> str:
        """``sandbox.cmd.pause.sbx1`` → ``pause``."""
        return self.subject.split(".")[2]


class RecordingPublisher:
    def __init__(self, *, deliver: Deliver | None = None) -> None:
        self.published: list[Published] = []
        self.duplicates: list[Published] = []
        self.deliver = deliver
        self.fail_with: Exception | None = None
        self._ids: set[str] = set()
        self._deliveries: set[asyncio.Task[Any]] = set()
        self.delivery_errors: list[BaseException] = []

    async def publish(self, message: BaseModel, subject: str, *, msg_id: str) -> bool:
        if self.fail_with is not None:
            error, self.fail_with = self.fail_with, None
            raise error
        out = Published(subject=subject, message=message, msg_id=msg_id)
        if msg_id in self._ids:
            self.duplicates.append(out)
            return False
        self._ids.add(msg_id)
        self.published.append(out)
        if self.deliver is not None:
            task = asyncio.get_running_loop().create_task(self._deliver(out))
            self._deliveries.add(task)
            task.add_done_callback(self._deliveries.discard)
        return True

    async def _deliver(self, out: Published) -> None:
        assert self.deliver is not None
        try:
            await self.deliver(out)
        except Exception as e:  # a handler failure is the test's to inspect, not ours to raise
            self.delivery_errors.append(e)

    async def drain(self) -> None:
        """Wait until every delivery (and whatever it published in turn) has been handled."""
        while self._deliveries:
            await asyncio.gather(*list(self._deliveries), return_exceptions=True)

    def subjects(self) -> list[str]:
        return [p.subject for p in self.published]

    def of_type(self, kind: type[M]) -> list[M]:
        return [p.message for p in self.published if isinstance(p.message, kind)]
