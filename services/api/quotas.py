"""Where the routes ask the quota guard (``Wiring.quota``; none in unit tests with fakes)."""

from __future__ import annotations

from services.api.deps import Wiring
from shared.domain import states
from shared.domain.record import SandboxRecord


async def admit_create(w: Wiring, user: str) -> None:
    """The create rate; the counts are checked once the record exists (lifecycle admission)."""
    if w.quota is not None:
        await w.quota.before_create(user)


async def admit_resume(w: Wiring, record: SandboxRecord) -> None:
    """Running count and resume rate, for a resume that will start a pod."""
    if w.quota is not None and states.is_resumable(record.state):
        await w.quota.before_resume(record)
