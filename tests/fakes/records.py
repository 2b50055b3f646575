"""Sandbox records as the scaler writes them, for tests of code that reads records."""

from __future__ import annotations

from datetime import datetime, timedelta

from shared.domain.record import SandboxRecord
from shared.domain.states import SandboxState


def running_record(
    sandbox_id: str,
    *,
    at: datetime,
    owner: str = "alice",
    timeout: int = 2,
    auto_pause: bool = True,
) -> SandboxRecord:
    """A running sandbox (generation 1) whose full timeout starts at ``at``."""
    return SandboxRecord(
        sandbox_id=sandbox_id,
        owner=owner,
        state=SandboxState.RUNNING,
        generation=1,
        timeout=timeout,
        auto_pause=auto_pause,
        created_at=at,
        started_at=at,
        deadline=at + timedelta(seconds=timeout),
        updated_at=at,
    )
