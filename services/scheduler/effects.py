"""What the scheduler's plans contain: timers, outgoing messages and record changes, built
from the record (``services.scheduler.expiry`` decides which)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from services.scheduler.plans import Decision, Outgoing
from shared.bus.schedules import Timer
from shared.domain import states
from shared.domain.record import Mutation, SandboxRecord
from shared.domain.timing import is_retained, predates_client_deadline
from shared.models.messages import KillSandbox, SandboxExpired, SandboxExpiring


def timeout_timer(record: SandboxRecord, notice: timedelta = timedelta(0)) -> Timer:
    """Due at the deadline, or ``notice`` before it (the template warns before expiry)."""
    assert record.deadline is not None
    return timeout_at(record, record.deadline - notice)


def timeout_at(record: SandboxRecord, due: datetime) -> Timer:
    return Timer(
        kind="timeout", sandbox_id=record.sandbox_id, generation=record.generation, due=due
    )


def pause_check_timer(record: SandboxRecord, *, attempt: int, due: datetime) -> Timer:
    return Timer(
        kind="pause_check",
        sandbox_id=record.sandbox_id,
        generation=record.generation,
        due=due,
        attempt=attempt,
    )


def retention_timer(record: SandboxRecord, due: datetime) -> Timer:
    return Timer(
        kind="retention", sandbox_id=record.sandbox_id, generation=record.generation, due=due
    )


def expired(
    record: SandboxRecord, decision: Decision, now: datetime, command: Outgoing, *id_extra: str
) -> Outgoing:
    return Outgoing.of(
        SandboxExpired(
            sandbox_id=record.sandbox_id,
            generation=record.generation,
            at=now,
            decision=decision,
            deadline=record.deadline or now,
            command=f"{command.subject} {command.msg_id}",
        ),
        *id_extra,
    )


def expiring(
    record: SandboxRecord, decision: Decision, now: datetime, notice: timedelta
) -> Outgoing:
    assert record.deadline is not None
    return Outgoing.of(
        SandboxExpiring(
            sandbox_id=record.sandbox_id,
            generation=record.generation,
            at=now,
            decision=decision,
            deadline=record.deadline,
            notice_seconds=int(notice.total_seconds()),
        ),
        record.deadline.strftime("%Y%m%dT%H%M%S%f"),  # once per deadline
    )


def kill(record: SandboxRecord, reason: Literal["timeout", "retention"]) -> Outgoing:
    sid, gen = record.sandbox_id, record.generation
    return Outgoing.of(KillSandbox(sandbox_id=sid, generation=gen, reason=reason))


def extend_deadline(wanted: datetime, seen_at: datetime) -> Mutation:
    """Activity seen at ``seen_at`` earns ``wanted``; applied to the record as it is then (a
    client may have set the deadline since the plan was made from an older read)."""

    def mutate(record: SandboxRecord) -> SandboxRecord:
        if not states.is_running(record.state) or predates_client_deadline(record, seen_at):
            return record
        if record.deadline is not None and record.deadline >= wanted:
            return record
        return record.model_copy(update={"deadline": wanted})

    return mutate


def set_retention(retain_until: datetime) -> Mutation:
    def mutate(record: SandboxRecord) -> SandboxRecord:
        if not is_retained(record) or record.retain_until is not None:
            return record
        return record.model_copy(update={"retain_until": retain_until})

    return mutate


def clear_retention(record: SandboxRecord) -> SandboxRecord:
    if is_retained(record):
        return record
    return record.model_copy(update={"retain_until": None})
