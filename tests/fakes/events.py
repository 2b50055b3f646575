"""``EventLog`` in memory: events appended in stream order, read back by NATS subject filters
(``*`` one token, ``>`` the rest), from a time or after a sequence, like the real consumer."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from shared.ports.events import StoredEvent


def subject_matches(filter_: str, subject: str) -> bool:
    want, got = filter_.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or (token != "*" and token != got[i]):
            return False
    return len(want) == len(got)


class InMemoryEventLog:
    def __init__(self) -> None:
        self.events: list[StoredEvent] = []

    def append(
        self, subject: str, data: bytes, *, msg_id: str | None, at: datetime | None = None
    ) -> StoredEvent:
        event = StoredEvent(
            seq=len(self.events) + 1,
            subject=subject,
            data=data,
            msg_id=msg_id,
            stored_at=at or datetime.now(UTC),
        )
        self.events.append(event)
        return event

    async def read(
        self,
        subjects: Sequence[str],
        *,
        since: datetime | None = None,
        after_seq: int = 0,
        limit: int,
    ) -> list[StoredEvent]:
        out = [
            e
            for e in self.events
            if e.seq > after_seq
            and (since is None or (e.stored_at is not None and e.stored_at >= since))
            and any(subject_matches(f, e.subject) for f in subjects)
        ]
        return out[:limit]
