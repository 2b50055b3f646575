"""Where the routes ask the quota guard (``Wiring.quota``; none in unit tests with fakes)."""

from __future__ import annotations

from services.api.deps import Wiring
from shared.models.sandboxes import SandboxRecord, SandboxState

# States from which a resume starts a new pod (others join one in flight, or need none).
WAKES = frozenset({SandboxState.PAUSED, SandboxState.PAUSING, SandboxState.FAILED})


async def admit_create(w: Wiring, user: str) -> None:
    """The create rate; the counts are checked once the record exists (lifecycle admission)."""
    if w.quota is not None:
        await w.quota.before_create(user)


async def admit_resume(w: Wiring, record: SandboxRecord) -> None:
    """Running count and resume rate, for a resume that will start a pod."""
    if w.quota is not None and record.state in WAKES:
        await w.quota.before_resume(record)
