"""The sandbox state machine: one transition table, and the record mutations that read it.

Each mutation is a ``Mutation`` for ``SandboxStore.update`` (a compare-and-set loop): it is
re-evaluated on every CAS attempt against the freshest record and raises ``IllegalTransition``
when the table does not allow the step from the record's state. That is what makes
redeliveries, duplicates and races between replicas harmless: exactly one writer wins each step.

Ownership of a transition in flight is ``record.pending.cmd_msg_id``: a redelivered command whose
message id equals it continues the work; any other command finds the record busy.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from shared.domain.record import Mutation, Pending, SandboxRecord, SnapshotRef
from shared.domain.states import SandboxState
from shared.domain.timing import deadline_after, retained_until
from shared.errors import IllegalTransition
from shared.models.lifecycle import HookOutcome
from shared.models.messages import ResumeReport, StartPath
from shared.redaction import redact_text

S = SandboxState

# A command: it moves the record into a transitional state and owns it until it ends.
Op = Literal["create", "pause", "resume", "kill"]
# Every step a record can take: a command beginning, its end, or giving it up.
Step = Literal[
    "create",
    "pause",
    "resume",
    "kill",
    "created",
    "paused",
    "resumed",
    "killed",
    "failed",
    "pause_refused",
    "resume_failed",
]


@dataclass(frozen=True)
class Rule:
    sources: frozenset[SandboxState]  # the states the step may start from
    target: SandboxState


def _rule(sources: set[SandboxState], target: SandboxState) -> Rule:
    return Rule(frozenset(sources), target)


# THE table. ``create`` claims the record the api wrote as ``creating`` (so it starts and stays
# there); ``failed`` ends whichever command is in flight, with the pod left as it is.
TABLE: dict[Step, Rule] = {
    "create": _rule({S.CREATING}, S.CREATING),
    "pause": _rule({S.RUNNING}, S.PAUSING),
    "resume": _rule({S.PAUSED, S.FAILED}, S.RESUMING),
    "kill": _rule({S.CREATING, S.RUNNING, S.PAUSING, S.PAUSED, S.RESUMING, S.FAILED}, S.KILLING),
    "created": _rule({S.CREATING}, S.RUNNING),
    "paused": _rule({S.PAUSING}, S.PAUSED),
    "resumed": _rule({S.RESUMING}, S.RUNNING),
    "killed": _rule({S.KILLING}, S.KILLED),
    "failed": _rule({S.CREATING, S.PAUSING, S.RESUMING, S.KILLING}, S.FAILED),
    # A prePause hook refused the pause before anything was captured: back to running.
    "pause_refused": _rule({S.PAUSING}, S.RUNNING),
    # The resumed pod never became ready (its template's ready command kept failing): the pod is
    # stopped again and the sandbox stays paused with its snapshot, the reason on the record.
    "resume_failed": _rule({S.RESUMING}, S.PAUSED),
}
# The step that ends each command successfully.
DONE: dict[Op, Step] = {
    "create": "created",
    "pause": "paused",
    "resume": "resumed",
    "kill": "killed",
}


def can(state: SandboxState, step: Step) -> bool:
    """The table allows ``step`` from ``state``."""
    return state in TABLE[step].sources


def in_flight(op: Op) -> SandboxState:
    """The transitional state ``op`` moves through; a give-up turns it into FAILED."""
    return TABLE[op].target


def can_pause(state: SandboxState) -> bool:
    return can(state, "pause")


def can_resume(state: SandboxState) -> bool:
    return can(state, "resume")


def now() -> datetime:
    return datetime.now(UTC)


def _illegal(record: SandboxRecord, what: str) -> IllegalTransition:
    msg = (
        f"sandbox {record.sandbox_id}: cannot {what} from {record.state.value} "
        f"(g{record.generation})"
    )
    return IllegalTransition(msg, state=record.state.value)


def _check(record: SandboxRecord, step: Step, what: str) -> None:
    if not can(record.state, step):
        raise _illegal(record, what)


def owns(record: SandboxRecord, op: Op, cmd_msg_id: str) -> bool:
    """The record is mid-``op`` on behalf of exactly this command (a redelivery continues)."""
    return (
        record.state == in_flight(op)
        and record.pending is not None
        and record.pending.op == op
        and record.pending.cmd_msg_id == cmd_msg_id
    )


def begin(op: Op, cmd_msg_id: str, *, generation: int | None) -> Mutation:
    """Enter the transitional state of ``op`` and take ownership, or continue if already owned.

    ``generation`` is the command's precondition (optimistic concurrency, like a resourceVersion):
    a command for an older generation is stale and does nothing. ``None`` skips the check
    (user kills apply whatever happened since).
    """

    def mutate(record: SandboxRecord) -> SandboxRecord:
        if owns(record, op, cmd_msg_id):
            return record
        _check(record, op, op)
        if record.state == TABLE[op].target and record.pending is not None:
            raise _illegal(record, op)  # ``create`` starts in its own state: claimed already
        if generation is not None and generation != record.generation:
            msg = (
                f"stale {op} for g{generation}; sandbox {record.sandbox_id} "
                f"is at g{record.generation}"
            )
            raise IllegalTransition(msg, state=record.state.value)
        return record.model_copy(
            update={
                "state": TABLE[op].target,
                "pending": Pending(op=op, cmd_msg_id=cmd_msg_id, started_at=now()),
            }
        )

    return mutate


def _require(op: Op, cmd_msg_id: str) -> Mutation:
    def check(record: SandboxRecord) -> SandboxRecord:
        if not owns(record, op, cmd_msg_id):
            raise _illegal(record, f"continue {op} ({cmd_msg_id})")
        return record

    return check


def store_snapshot(cmd_msg_id: str, ref: SnapshotRef) -> Mutation:
    """Pausing: remember the snapshot written on the workload (the record keeps a full copy)."""
    check = _require("pause", cmd_msg_id)

    def mutate(record: SandboxRecord) -> SandboxRecord:
        stored = ref.model_copy(update={"pause_msg_id": cmd_msg_id})
        return check(record).model_copy(update={"snapshot": stored})

    return mutate


def snapshot_of_this_pause(record: SandboxRecord) -> SnapshotRef | None:
    """The record's snapshot if it was captured during the pause in flight (not a previous one).

    Known by the pause command that stored it: a time rule would take a previous pause's
    capture for this one when a pause follows a resume within the allowed skew, and the sandbox
    would come back with the processes of its earlier life."""
    if record.state != S.PAUSING or record.pending is None or record.snapshot is None:
        return None
    if record.snapshot.pause_msg_id is not None:
        mine = record.snapshot.pause_msg_id == record.pending.cmd_msg_id
        return record.snapshot if mine else None
    # Stored before the command id was kept: the capture happens after the pause began; allow a
    # little clock skew between replicas.
    captured = parse_captured_time(record.snapshot.captured_at)
    # The capture happens after the pause began; allow a little clock skew between replicas.
    if captured + timedelta(seconds=5) < record.pending.started_at:
        return None
    return record.snapshot


def parse_captured_time(value: str) -> datetime:
    # "2026-09-03T03:25:21.201354569Z": Python keeps microseconds, so drop the extra digits.
    head, _, frac = value.rstrip("Z").partition(".")
    micros = (frac + "000000")[:6] if frac else "000000"
    return datetime.fromisoformat(f"{head}.{micros}+00:00")


def running(
    *,
    op: Literal["create", "resume"],
    cmd_msg_id: str,
    host: str,
    pod_uid: str,
    path: StartPath = "cold",
    timeout: int | None = None,
    auto_pause: bool | None = None,
    report: ResumeReport | None = None,
) -> Mutation:
    """Creating/resuming → running on a ready pod: a full timeout starts now, generation+1.
    A resume keeps its ``report`` on the record (shown by the APIs until the next resume) and
    may change whether the sandbox pauses on timeout (``auto_pause``, when given)."""
    check = _require(op, cmd_msg_id)

    def mutate(record: SandboxRecord) -> SandboxRecord:
        check(record)
        _check(record, DONE[op], f"finish {op}")
        at = now()
        effective = timeout or record.timeout
        return record.model_copy(
            update={
                "state": TABLE[DONE[op]].target,
                "generation": record.generation + 1,
                "host": host,
                "pod_uid": pod_uid,
                "path": path,
                "timeout": effective,
                "auto_pause": record.auto_pause if auto_pause is None else auto_pause,
                "started_at": at,
                "deadline": deadline_after(at, effective),
                "paused_at": None,
                "retain_until": None,
                "pending": None,
                "failure": None,
                "last_resume": report if report is not None else record.last_resume,
                "refused_pause": None,
            }
        )

    return mutate


def paused(*, generation: int, retention: timedelta) -> Mutation:
    """Pausing → paused, once the pod is gone and the snapshot is stored (generation+1)."""

    def mutate(record: SandboxRecord) -> SandboxRecord:
        if not can(record.state, "paused") or record.generation != generation:
            raise _illegal(record, f"finish pause of g{generation}")
        if snapshot_of_this_pause(record) is None:
            raise _illegal(record, "finish a pause without its snapshot")
        at = now()
        return record.model_copy(
            update={
                "state": TABLE["paused"].target,
                "generation": record.generation + 1,
                "host": None,
                "pod_uid": None,
                "deadline": None,
                "paused_at": at,
                "retain_until": retained_until(at, retention),
                "pending": None,
                "failure": None,
                "refused_pause": None,
            }
        )

    return mutate


def pause_refused(cmd_msg_id: str, outcome: HookOutcome) -> Mutation:
    """Pausing → running: a prePause hook refused the pause (nothing was captured, the pod never
    stopped). generation+1 (waiters see the end; a retry gets a fresh id), the outcome kept as
    the reason, and a full timeout from now, so a refused timeout pause is not retried at once."""
    check = _require("pause", cmd_msg_id)

    def mutate(record: SandboxRecord) -> SandboxRecord:
        check(record)
        _check(record, "pause_refused", "refuse a pause")
        wanted = deadline_after(now(), record.timeout)
        deadline = max(record.deadline, wanted) if record.deadline is not None else wanted
        return record.model_copy(
            update={
                "state": TABLE["pause_refused"].target,
                "generation": record.generation + 1,
                "pending": None,
                "deadline": deadline,
                "refused_pause": outcome,
            }
        )

    return mutate


def killed(cmd_msg_id: str, *, tombstone_for: timedelta) -> Mutation:
    """Killing → killed: the workload is deleted; the record stays as a tombstone for a while."""
    check = _require("kill", cmd_msg_id)

    def mutate(record: SandboxRecord) -> SandboxRecord:
        check(record)
        _check(record, "killed", "finish kill")
        return record.model_copy(
            update={
                "state": TABLE["killed"].target,
                "generation": record.generation + 1,
                "host": None,
                "pod_uid": None,
                "deadline": None,
                "pending": None,
                "retain_until": retained_until(now(), tombstone_for),
            }
        )

    return mutate


def failed(
    op: Op, reason: str, *, cmd_msg_id: str | None = None, generation: int | None = None
) -> Mutation:
    """Give up the transition in flight: FAILED with the reason (generation+1, so a retry by the
    user gets a fresh message id instead of being deduplicated). The pod is left as it is: a
    failed sandbox can be resumed (which reconciles the pod) or killed."""

    def mutate(record: SandboxRecord) -> SandboxRecord:
        if record.state != in_flight(op) or not can(record.state, "failed"):
            raise _illegal(record, f"fail {op}")
        if cmd_msg_id is not None and not owns(record, op, cmd_msg_id):
            raise _illegal(record, f"fail {op} owned by another command")
        if generation is not None and record.generation != generation:
            raise _illegal(record, f"fail {op} of g{generation}")
        return record.model_copy(
            update={
                "state": TABLE["failed"].target,
                "generation": record.generation + 1,
                "pending": None,
                "failure": redact_text(f"{op}: {reason}")[:1000],
            }
        )

    return mutate


def can_fail_back_to_paused(record: SandboxRecord) -> bool:
    """A resume in flight from a real pause (a snapshot and a pause time): a failure can leave
    it paused. One resumed from ``failed`` without them has nothing to go back to."""
    return record.state == in_flight("resume") and (
        record.snapshot is not None and record.paused_at is not None
    )


def resume_failed(cmd_msg_id: str, reason: str) -> Mutation:
    """Resuming → paused: the resume gave up with its pod stopped again (generation+1, so the
    API's waiter sees it end, and a retry gets a fresh message id). The snapshot, pause time and
    retention stay as they were; ``failure`` says why until the next successful transition."""
    check = _require("resume", cmd_msg_id)

    def mutate(record: SandboxRecord) -> SandboxRecord:
        check(record)
        _check(record, "resume_failed", "fail a resume back to paused")
        if not can_fail_back_to_paused(record):
            raise _illegal(record, "fail a resume back to paused without a snapshot")
        return record.model_copy(
            update={
                "state": TABLE["resume_failed"].target,
                "generation": record.generation + 1,
                "host": None,
                "pod_uid": None,
                "deadline": None,
                "pending": None,
                "failure": redact_text(f"resume: {reason}")[:1000],
            }
        )

    return mutate


# ---- recognising a redelivered command whose work is already done ------------------------------


def done_before(op: Op, record: SandboxRecord, *, generation: int | None = None) -> bool:
    """The record shows ``op`` (begun at ``generation``) already finished: the redelivered
    command only republishes its event, which may have been lost."""
    if op == "create":  # running and never paused: the first pod came up
        return record.state == S.RUNNING and record.paused_at is None and record.snapshot is None
    if op == "kill":
        return record.state == S.KILLED
    # pause and resume each move the generation on by one when they end.
    moved_on = generation is not None and record.generation == generation + 1
    return record.state == TABLE[DONE[op]].target and moved_on


def waits_for_pause(record: SandboxRecord, *, generation: int) -> bool:
    """A resume for ``generation`` met the pause of that generation still in flight: retry it
    once the pause ends (the user asked to resume what is being paused)."""
    return record.state == S.PAUSING and record.generation == generation
