"""The time rules: when a running sandbox expires and how long a paused one is kept."""

from __future__ import annotations

from datetime import datetime, timedelta

from shared.domain.record import SandboxRecord
from shared.domain.states import SandboxState


def deadline_after(at: datetime, timeout: int) -> datetime:
    """A running sandbox expires ``timeout`` seconds of inactivity after ``at`` (its start, its
    last activity, or a timeout change); ``timeout=0`` means now."""
    return at + timedelta(seconds=timeout)


def predates_client_deadline(record: SandboxRecord, seen_at: datetime | None) -> bool:
    """Activity seen before a client last set the deadline (``set_timeout``, connect) never
    moves it: its report may land after, so ``set_timeout(0)`` right after a request holds."""
    set_at = record.deadline_set_at
    return seen_at is not None and set_at is not None and seen_at < set_at


def retained_until(at: datetime, retention: timedelta) -> datetime:
    """A paused sandbox (or one whose create failed) is deleted ``retention`` after ``at``."""
    return at + retention


def is_retained(record: SandboxRecord) -> bool:
    """Kept only until ``retain_until``: paused, or failed before it ever ran."""
    return record.state == SandboxState.PAUSED or (
        record.state == SandboxState.FAILED and (record.failure or "").startswith("create")
    )
