"""What the dashboard needs from the bus (``events_feed.EventsFeed`` implements it)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Protocol

from services.api.dashboard.events_feed import Listener, SandboxEvent
from shared.auth.models import User


class EventSource(Protocol):
    def listen(self, *, size: int = 1000) -> AbstractAsyncContextManager[Listener]:
        """Subscribe to the live events of every sandbox until the context exits."""
        ...

    async def owner_of(self, sandbox_id: str) -> str | None:
        """The owner (killed tombstones included), or ``None`` if there is no such sandbox."""
        ...

    async def history(self, sandbox_id: str, *, limit: int = 200) -> list[SandboxEvent]: ...

    async def last_activity(self, sandbox_id: str) -> datetime | None: ...

    async def users(self) -> list[User]: ...
