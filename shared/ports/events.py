"""The event stream as a log to read back (the events API): narrow, so the routes and the
queries run on a fake in the unit tier."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


@dataclass(frozen=True)
class StoredEvent:
    seq: int  # stream sequence: total order of the stream
    subject: str
    data: bytes
    msg_id: str | None  # the publisher's Nats-Msg-Id: the event's stable id
    stored_at: datetime | None


class EventLog(Protocol):
    async def read(
        self,
        subjects: Sequence[str],
        *,
        since: datetime | None = None,
        after_seq: int = 0,
        limit: int,
    ) -> list[StoredEvent]:
        """Stored events on any of ``subjects`` (wildcards allowed) in stream order, from
        ``since`` (or the whole stream) and after ``after_seq``; at most ``limit`` of them."""
        ...
