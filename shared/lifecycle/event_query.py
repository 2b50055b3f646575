"""The events API's reads: one sandbox's events, or every event of a user, from the event
stream (``EventLog``), owner-scoped by the sandbox records (``SandboxStore``).

Events carry no owner; it is the record's (killed tombstones included). So a sandbox whose
tombstone is gone (``RetentionSettings.tombstone_seconds``, 1 day) no longer has listable
events, even though the stream keeps them for 7 days: torpor cannot tell whose they were.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from shared.bus import subjects as s
from shared.errors import InvalidInput, NotFound
from shared.models.public_events import FACT_TYPES, TYPE_FACTS, PublicEvent, public_event
from shared.ports.bus import SandboxStore
from shared.ports.events import EventLog, StoredEvent

_CHUNK = 1000
_STORE_SLACK = timedelta(minutes=10)


@dataclass(frozen=True)
class Page:
    offset: int = 0
    limit: int = 10
    order: Literal["asc", "desc"] = "desc"
    types: tuple[str, ...] = ()  # public types; empty: all
    since: datetime | None = None
    until: datetime | None = None


def facts_of(types: Sequence[str]) -> list[str]:
    """Bus facts of the requested public types (all when empty); an unknown type is a 400."""
    if not types:
        return list(FACT_TYPES)
    unknown = [t for t in types if t not in TYPE_FACTS]
    if unknown:
        shown = ", ".join(repr(t[:80]) for t in unknown[:3])
        msg = f"types: unknown event type {shown}; known: {', '.join(TYPE_FACTS)}"
        raise InvalidInput(msg)
    return list(dict.fromkeys(TYPE_FACTS[t] for t in types))


@dataclass
class _Owners:
    """Owner and template per sandbox id, read once per request."""

    store: SandboxStore
    seen: dict[str, tuple[str, str] | None] = field(default_factory=dict)

    async def of(self, sandbox_id: str) -> tuple[str, str] | None:
        if sandbox_id not in self.seen:
            record = await self.store.get(sandbox_id)
            self.seen[sandbox_id] = (record.owner, record.template) if record else None
        return self.seen[sandbox_id]


class EventQuery:
    def __init__(self, log: EventLog, records: SandboxStore, *, max_scan: int = 20_000) -> None:
        self._log = log
        self._records = records
        self._max_scan = max_scan

    async def of_sandbox(
        self, sandbox_id: str, *, owner: str | None, page: Page
    ) -> list[PublicEvent]:
        """``owner`` None: an admin (every sandbox). Another user's sandbox is ``NotFound``."""
        record = await self._records.get(sandbox_id)
        if record is None or (owner is not None and record.owner != owner):
            msg = f"sandbox {sandbox_id} not found"
            raise NotFound(msg)
        subjects = [s.of(f"{s.EVT_PREFIX}.{f}", sandbox_id) for f in facts_of(page.types)]
        raw = await self._log.read(subjects, since=_start(page), limit=self._max_scan)
        events = [
            e
            for r in raw
            if (
                e := public_event(
                    r.subject,
                    r.data,
                    event_id=r.msg_id,
                    seq=r.seq,
                    stored_at=r.stored_at,
                    owner=record.owner,
                    template=record.template,
                )
            )
            is not None
        ]
        return _window(events, page)

    async def of_owner(self, owner: str | None, *, page: Page) -> list[PublicEvent]:
        """Every event of ``owner``'s sandboxes (``None``: everyone's) in the window. Ascending
        reads stop once the page is full; descending reads the window to its end, at most
        ``max_scan`` events (then 400: narrow it with ``since``/``until``)."""
        subjects = [s.all_of(f"{s.EVT_PREFIX}.{f}") for f in facts_of(page.types)]
        owners = _Owners(self._records)
        wanted = page.offset + page.limit
        found: list[PublicEvent] = []
        scanned, after = 0, 0
        while True:
            raw = await self._log.read(subjects, since=_start(page), after_seq=after, limit=_CHUNK)
            for r in raw:
                after = r.seq
                event = await self._public(r, owners, owner)
                if event is not None and _in_time(event, page):
                    found.append(event)
            scanned += len(raw)
            if len(raw) < _CHUNK:
                break
            if page.order == "asc" and len(found) >= wanted:
                break
            if scanned >= self._max_scan:
                msg = (
                    f"since: more than {self._max_scan} events in the window; narrow it with "
                    "since/until"
                )
                raise InvalidInput(msg)
        return _window(found, page)

    async def _public(
        self, r: StoredEvent, owners: _Owners, owner: str | None
    ) -> PublicEvent | None:
        known = await owners.of(s.sandbox_id_of(r.subject))
        if known is None or (owner is not None and known[0] != owner):
            return None
        return public_event(
            r.subject,
            r.data,
            event_id=r.msg_id,
            seq=r.seq,
            stored_at=r.stored_at,
            owner=known[0],
            template=known[1],
        )


def _start(page: Page) -> datetime | None:
    """Where to start reading: the stream indexes the time an event was stored, a little after
    its ``at``; the exact filter is on ``at`` (``_in_time``)."""
    return None if page.since is None else page.since - _STORE_SLACK


def _in_time(event: PublicEvent, page: Page) -> bool:
    if page.since is not None and event.timestamp < page.since:
        return False
    return page.until is None or event.timestamp <= page.until


def _window(events: list[PublicEvent], page: Page) -> list[PublicEvent]:
    events = sorted((e for e in events if _in_time(e, page)), key=lambda e: e.seq)
    if page.order == "desc":
        events.reverse()
    return events[page.offset : page.offset + page.limit]
