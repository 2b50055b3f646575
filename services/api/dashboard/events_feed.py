"""Sandbox events for people (the dashboard, ``torpor sandbox logs``).

- Live: ONE core subscription on ``sandbox.evt.>`` per process, fanned out to in-process
  listeners. At-most-once is right for a screen: a listener that falls behind is told it lagged
  and re-reads the list, and a reconnecting browser does the same.
- History: read from the ``SANDBOX_EVT`` stream by subject (``STREAM.MSG.GET`` with
  ``next_by_subj``), one scan per fact. Activity reports are throttled but can still number in
  the thousands for a busy sandbox, so history carries only the latest one.
- Owners: events carry no owner; it is looked up in the sandbox KV (tombstones included, so the
  ``killed`` event of a deleted sandbox is still attributed) and cached.

NATS permissions this needs beyond the api user's: subscribe ``sandbox.evt.>`` and publish
``$JS.API.STREAM.MSG.GET.SANDBOX_EVT``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import nats
import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.errors import NotFoundError
from pydantic import BaseModel, ConfigDict, Field

from shared.auth.keys import KvUsers
from shared.auth.models import User
from shared.bus import subjects as s
from shared.bus.broker import connect_options
from shared.bus.kv import NatsBucket
from shared.bus.records import KvSandboxStore
from shared.bus.topology import KV_SANDBOXES, KV_USERS, STREAM_EVT
from shared.errors import Unavailable
from shared.settings import BusSettings

log = structlog.get_logger()

# Every fact but activity, scanned for history.
HISTORY_FACTS = (
    "created",
    "snapshotted",
    "paused",
    "resumed",
    "killed",
    "failed",
    "expired",
    "timeout_set",
)
ACTIVITY = "activity"
_OWNER_CACHE_MAX = 10_000


class SandboxEvent(BaseModel):
    """One event as people see it: the fact, when, and the payload (schema-versioned JSON)."""

    model_config = ConfigDict(frozen=True)

    seq: int | None = None  # stream sequence (history only)
    fact: str
    sandbox_id: str
    at: datetime | None = None
    data: dict[str, Any] = Field(default_factory=dict)


def event_from(
    subject: str, payload: bytes | None, *, seq: int | None = None, time: datetime | None = None
) -> SandboxEvent | None:
    """``sandbox.evt.<fact>.<sid>`` + JSON body; ``None`` for anything else."""
    parts = subject.split(".")
    if len(parts) != 4 or f"{parts[0]}.{parts[1]}" != s.EVT_PREFIX:
        return None
    try:
        data = json.loads(payload or b"{}")
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    at: datetime | None = time
    raw_at = data.get("at")
    if isinstance(raw_at, str):
        with contextlib.suppress(ValueError):
            at = datetime.fromisoformat(raw_at.replace("Z", "+00:00"))
    if at is not None and at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return SandboxEvent(seq=seq, fact=parts[2], sandbox_id=parts[3], at=at, data=data)


class Listener:
    """One consumer of the live feed: a bounded queue; ``lagged`` when events were dropped."""

    def __init__(self, size: int) -> None:
        self.queue: asyncio.Queue[SandboxEvent] = asyncio.Queue(maxsize=size)
        self.lagged = False

    def offer(self, event: SandboxEvent) -> None:
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.lagged = True


class EventsFeed:
    def __init__(self, nc: NatsClient, *, store: KvSandboxStore, users: KvUsers) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self._store = store
        self._users = users
        self._listeners: set[Listener] = set()
        self._owners: dict[str, str] = {}
        self._sub: Any = None

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, bus: BusSettings, *, service: str = "api", connect_within: float = 10.0
    ) -> AsyncIterator[EventsFeed]:
        extra: dict[str, Any] = connect_options(bus)
        try:
            nc = await asyncio.wait_for(
                nats.connect(
                    servers=bus.nats_url.split(","),
                    name=f"torpor-{service}-events",
                    inbox_prefix=f"_INBOX_{service}",
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=1,
                    **extra,
                ),
                connect_within,
            )
        except (OSError, TimeoutError, NatsError) as e:
            msg = f"events feed: cannot connect to NATS ({type(e).__name__})"
            raise Unavailable(msg) from e
        try:
            js = nc.jetstream()
            store = KvSandboxStore(await js.key_value(KV_SANDBOXES))
            users = KvUsers(NatsBucket(await js.key_value(KV_USERS)))
            feed = cls(nc, store=store, users=users)
            await feed._start()
            yield feed
        finally:
            with contextlib.suppress(Exception):
                await nc.drain()

    async def _start(self) -> None:
        self._sub = await self._nc.subscribe(f"{s.EVT_PREFIX}.>", cb=self._on_message)

    async def _on_message(self, msg: Msg) -> None:
        event = event_from(msg.subject, msg.data)
        if event is None or not self._listeners:
            return
        for listener in list(self._listeners):
            listener.offer(event)

    @contextlib.asynccontextmanager
    async def listen(self, *, size: int = 1000) -> AsyncIterator[Listener]:
        listener = Listener(size)
        self._listeners.add(listener)
        try:
            yield listener
        finally:
            self._listeners.discard(listener)

    async def owner_of(self, sandbox_id: str) -> str | None:
        """The sandbox's owner (also for killed tombstones), or ``None`` if unknown."""
        if (cached := self._owners.get(sandbox_id)) is not None:
            return cached
        try:
            record = await self._store.get(sandbox_id)
        except (NatsError, TimeoutError) as e:
            msg = f"cannot read sandbox {sandbox_id}: {type(e).__name__}"
            raise Unavailable(msg) from e
        if record is None:
            return None
        if len(self._owners) >= _OWNER_CACHE_MAX:
            self._owners.clear()
        self._owners[sandbox_id] = record.owner
        return record.owner

    async def _scan(self, subject: str, limit: int) -> list[SandboxEvent]:
        """The last ``limit`` messages on ``subject``, oldest first."""
        found: deque[SandboxEvent] = deque(maxlen=limit)
        seq = 1
        while True:
            try:
                raw = await self._js.get_msg(STREAM_EVT, seq=seq, subject=subject, next=True)
            except NotFoundError:
                break
            if raw.seq is None or raw.subject is None:
                break
            if (event := event_from(raw.subject, raw.data, seq=raw.seq, time=raw.time)) is not None:
                found.append(event)
            seq = raw.seq + 1
        return list(found)

    async def history(self, sandbox_id: str, *, limit: int = 200) -> list[SandboxEvent]:
        """Lifecycle events of one sandbox in stream order (the last ``limit``), plus its latest
        activity report."""
        try:
            scans = await asyncio.gather(
                *(
                    self._scan(s.of(f"{s.EVT_PREFIX}.{fact}", sandbox_id), limit)
                    for fact in HISTORY_FACTS
                )
            )
            last = await self._last(s.of(s.EVT_ACTIVITY, sandbox_id))
        except (NatsError, TimeoutError) as e:
            msg = f"cannot read the events of {sandbox_id}: {type(e).__name__}"
            raise Unavailable(msg) from e
        events = [e for scan in scans for e in scan]
        if last is not None:
            events.append(last)
        events.sort(key=lambda e: e.seq or 0)
        return events[-limit:]

    async def _last(self, subject: str) -> SandboxEvent | None:
        try:
            raw = await self._js.get_msg(STREAM_EVT, subject=subject)
        except NotFoundError:
            return None
        if raw.subject is None:
            return None
        return event_from(raw.subject, raw.data, seq=raw.seq, time=raw.time)

    async def last_activity(self, sandbox_id: str) -> datetime | None:
        try:
            last = await self._last(s.of(s.EVT_ACTIVITY, sandbox_id))
        except (NatsError, TimeoutError):
            return None  # a nicety for the screen, never worth an error
        return last.at if last is not None else None

    async def users(self) -> list[User]:
        try:
            return await self._users.list()
        except (NatsError, TimeoutError) as e:
            msg = f"cannot list users: {type(e).__name__}"
            raise Unavailable(msg) from e
