"""The sandbox state machine as pure record mutations, shared by the snapshotter and the scaler.

Each function returns a ``Mutation`` for ``SandboxStore.update`` (a compare-and-set loop): it is
re-evaluated on every CAS attempt against the freshest record and raises ``IllegalTransition``
when the record is no longer in a state it may start from. That is what makes redeliveries,
duplicates and races between replicas harmless: exactly one writer wins each step.

Ownership of a transition in flight is ``record.pending.cmd_msg_id``: a redelivered command whose
message id equals it continues the work; any other command finds the record busy.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

from shared.bus.ports import Mutation
from shared.errors import IllegalTransition
from shared.models.sandboxes import Pending, SandboxRecord, SandboxState, SnapshotRef
from shared.redaction import redact_text
from shared.runtime.models import Endpoint

Op = Literal["create", "pause", "resume", "kill"]

# The transitional state each op moves through; a give-up turns it into FAILED.
IN_FLIGHT: dict[str, SandboxState] = {
    "create": SandboxState.CREATING,
    "pause": SandboxState.PAUSING,
    "resume": SandboxState.RESUMING,
    "kill": SandboxState.KILLING,
}


def now() -> datetime:
    return datetime.now(UTC)


def _illegal(record: SandboxRecord, what: str) -> IllegalTransition:
    msg = (
        f"sandbox {record.sandbox_id}: cannot {what} from {record.state.value} "
        f"(g{record.generation})"
    )
    return IllegalTransition(msg, state=record.state.value)


def owns(record: SandboxRecord, op: Op, cmd_msg_id: str) -> bool:
    """The record is mid-``op`` on behalf of exactly this command (a redelivery continues)."""
    return (
        record.state == IN_FLIGHT[op]
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
    transition = {"create": "created", "pause": "pause", "resume": "resume", "kill": "kill"}[op]

    def mutate(record: SandboxRecord) -> SandboxRecord:
        if owns(record, op, cmd_msg_id):
            return record
        if op == "create":
            # The record is born CREATING; the command only claims it.
            if record.state != SandboxState.CREATING or record.pending is not None:
                raise _illegal(record, "create")
        elif not record.can(transition) or record.state == IN_FLIGHT[op]:
            raise _illegal(record, op)
        if generation is not None and generation != record.generation:
            msg = (
                f"stale {op} for g{generation}; sandbox {record.sandbox_id} "
                f"is at g{record.generation}"
            )
            raise IllegalTransition(msg, state=record.state.value)
        return record.model_copy(
            update={
                "state": IN_FLIGHT[op],
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
        return check(record).model_copy(update={"snapshot": ref})

    return mutate


def snapshot_of_this_pause(record: SandboxRecord) -> SnapshotRef | None:
    """The record's snapshot if it was captured during the pause in flight (not a previous one)."""
    if record.state != SandboxState.PAUSING or record.pending is None or record.snapshot is None:
        return None
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
    endpoint: Endpoint,
    timeout: int | None = None,
) -> Mutation:
    """Creating/resuming → running on a ready pod: a full timeout starts now, generation+1."""
    check = _require(op, cmd_msg_id)

    def mutate(record: SandboxRecord) -> SandboxRecord:
        check(record)
        at = now()
        effective = timeout or record.timeout
        return record.model_copy(
            update={
                "state": SandboxState.RUNNING,
                "generation": record.generation + 1,
                "host": endpoint.host,
                "pod_uid": endpoint.pod_uid,
                "timeout": effective,
                "started_at": at,
                "deadline": at + timedelta(seconds=effective),
                "paused_at": None,
                "retain_until": None,
                "pending": None,
                "failure": None,
            }
        )

    return mutate


def paused(*, generation: int, retention: timedelta) -> Mutation:
    """Pausing → paused, once the pod is gone and the snapshot is stored (generation+1)."""

    def mutate(record: SandboxRecord) -> SandboxRecord:
        if record.state != SandboxState.PAUSING or record.generation != generation:
            raise _illegal(record, f"finish pause of g{generation}")
        if snapshot_of_this_pause(record) is None:
            raise _illegal(record, "finish a pause without its snapshot")
        at = now()
        return record.model_copy(
            update={
                "state": SandboxState.PAUSED,
                "generation": record.generation + 1,
                "host": None,
                "pod_uid": None,
                "deadline": None,
                "paused_at": at,
                "retain_until": at + retention,
                "pending": None,
                "failure": None,
            }
        )

    return mutate


def killed(cmd_msg_id: str, *, tombstone_for: timedelta) -> Mutation:
    """Killing → killed: the workload is deleted; the record stays as a tombstone for a while."""
    check = _require("kill", cmd_msg_id)

    def mutate(record: SandboxRecord) -> SandboxRecord:
        check(record)
        return record.model_copy(
            update={
                "state": SandboxState.KILLED,
                "generation": record.generation + 1,
                "host": None,
                "pod_uid": None,
                "deadline": None,
                "pending": None,
                "retain_until": now() + tombstone_for,
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
        if record.state != IN_FLIGHT[op]:
            raise _illegal(record, f"fail {op}")
        if cmd_msg_id is not None and not owns(record, op, cmd_msg_id):
            raise _illegal(record, f"fail {op} owned by another command")
        if generation is not None and record.generation != generation:
            raise _illegal(record, f"fail {op} of g{generation}")
        return record.model_copy(
            update={
                "state": SandboxState.FAILED,
                "generation": record.generation + 1,
                "pending": None,
                "failure": redact_text(f"{op}: {reason}")[:1000],
            }
        )

    return mutate
