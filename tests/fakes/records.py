"""Sandbox records as the scaler writes them, for tests of code that reads records."""

from __future__ import annotations

from collections.abc import Callable
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


def paused_without_retention(
    at: datetime, *, generation: int
) -> Callable[[SandboxRecord], SandboxRecord]:
    """A store mutation: the sandbox paused at ``at`` as ``generation``, no deadline, and no
    ``retain_until`` (left for the scheduler to compute and record)."""

    def mutate(r: SandboxRecord) -> SandboxRecord:
        return r.model_copy(
            update={
                "state": SandboxState.PAUSED,
                "generation": generation,
                "deadline": None,
                "paused_at": at,
            }
        )

    return mutate
