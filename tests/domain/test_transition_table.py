"""The transition table is the state machine: every (state, step) pair agrees with the mutation.

For each step of ``shared.domain.transitions.TABLE`` and each state, the step's mutation is
applied to a record in that state (prepared as the step needs: owned by the command, with the
pause's snapshot, …). It must succeed exactly when the table allows the step from that state,
and land in the table's target state. A step added to the table without a mutation (or a
mutation that stops reading the table) fails here.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from shared.domain import states
from shared.domain import transitions as t
from shared.domain.record import Pending, SandboxRecord, SnapshotRef
from shared.domain.states import SandboxState
from shared.domain.timing import deadline_after, is_retained
from shared.errors import IllegalTransition
from shared.models.lifecycle import HookOutcome

NOW = datetime.now(UTC)
GEN = 4
MSG = "cmd-1"


def record(state: SandboxState, *, pending: Pending | None = None, **kw: object) -> SandboxRecord:
    fields: dict[str, object] = {
        "sandbox_id": "sbx",
        "owner": "alice",
        "state": state,
        "generation": GEN,
        "created_at": NOW,
        "started_at": NOW,
        "updated_at": NOW,
        "pending": pending,
        **kw,
    }
    return SandboxRecord.model_validate(fields)


def owned(op: t.Op) -> Pending:
    return Pending(op=op, cmd_msg_id=MSG, started_at=NOW - timedelta(seconds=1))


def snapshot() -> SnapshotRef:
    return SnapshotRef(id="s", captured_at=NOW.isoformat(), process_count=0, annotation="e30=")


REFUSAL = HookOutcome(hook="prePause", source="sandbox", policy="abort", ok=False, exit_code=3)

# How to attempt each step from a state: (record in that state, the step's mutation).
Attempt = Callable[[SandboxState], tuple[SandboxRecord, Callable[[SandboxRecord], SandboxRecord]]]


def _begin(op: t.Op) -> Attempt:
    return lambda s: (record(s), t.begin(op, MSG, generation=GEN))


def _running(op: t.Op) -> Attempt:
    assert op in ("create", "resume")
    return lambda s: (
        record(s, pending=owned(op)),
        t.running(op=op, cmd_msg_id=MSG, host="127.0.0.9", pod_uid="u"),  # type: ignore[arg-type]
    )


ATTEMPTS: dict[t.Step, Attempt] = {
    "create": _begin("create"),
    "pause": _begin("pause"),
    "resume": _begin("resume"),
    "kill": _begin("kill"),
    "created": _running("create"),
    "resumed": _running("resume"),
    "paused": lambda s: (
        record(s, pending=owned("pause"), snapshot=snapshot()),
        t.paused(generation=GEN, retention=timedelta(days=1)),
    ),
    "killed": lambda s: (
        record(s, pending=owned("kill")),
        t.killed(MSG, tombstone_for=timedelta(hours=1)),
    ),
    "pause_refused": lambda s: (
        record(s, pending=owned("pause")),
        t.pause_refused(MSG, REFUSAL),
    ),
    "resume_failed": lambda s: (
        record(s, pending=owned("resume"), snapshot=snapshot(), paused_at=NOW),
        t.resume_failed(MSG, "ready command failed: exit 3"),
    ),
}


def test_every_step_of_the_table_has_a_mutation() -> None:
    assert set(ATTEMPTS) | {"failed"} == set(t.TABLE)


@pytest.mark.parametrize("state", list(SandboxState))
@pytest.mark.parametrize("step", sorted(ATTEMPTS))
def test_each_mutation_agrees_with_the_table(step: t.Step, state: SandboxState) -> None:
    before, mutate = ATTEMPTS[step](state)
    if t.can(state, step):
        after = mutate(before)
        assert after.state == t.TABLE[step].target
    else:
        with pytest.raises(IllegalTransition):
            mutate(before)


@pytest.mark.parametrize("state", list(SandboxState))
@pytest.mark.parametrize("op", ["create", "pause", "resume", "kill"])
def test_giving_up_agrees_with_the_table(op: t.Op, state: SandboxState) -> None:
    before = record(state, pending=owned(op))
    mutate = t.failed(op, "boom", cmd_msg_id=MSG)
    if t.can(state, "failed") and state == t.in_flight(op):
        assert mutate(before).state == SandboxState.FAILED
    else:
        with pytest.raises(IllegalTransition):
            mutate(before)


@pytest.mark.parametrize("op", ["create", "pause", "resume", "kill"])
def test_each_command_is_in_flight_in_a_transitional_state_that_can_fail(op: t.Op) -> None:
    assert states.is_transitional(t.in_flight(op))
    assert t.can(t.in_flight(op), "failed")
    assert t.can(t.in_flight(op), t.DONE[op])


@pytest.mark.parametrize("op", ["create", "pause", "resume", "kill"])
def test_a_claimed_record_refuses_a_second_command_and_continues_its_own(op: t.Op) -> None:
    claimed = record(t.in_flight(op), pending=owned(op))
    assert t.begin(op, MSG, generation=GEN)(claimed) is claimed  # a redelivery continues
    with pytest.raises(IllegalTransition):
        t.begin(op, "cmd-2", generation=GEN)(claimed)


def test_no_step_leaves_killed() -> None:
    assert not any(t.can(SandboxState.KILLED, step) for step in t.TABLE)


@pytest.mark.parametrize("state", list(SandboxState))
def test_predicates_agree_with_the_table(state: SandboxState) -> None:
    assert t.can_pause(state) == t.can(state, "pause")
    assert t.can_resume(state) == t.can(state, "resume")
    # Every state but the gone ones can be killed; gone ones are hidden from users.
    assert t.can(state, "kill") == (not states.is_gone(state))
    assert states.is_visible(state) == (not states.is_gone(state))
    # What a resume wakes is resumable by the table, or pausing (the resume follows the pause).
    assert states.is_resumable(state) == (t.can_resume(state) or state == SandboxState.PAUSING)
    # A settled state (or a gone one) is where no command is in flight but a kill.
    assert states.is_settled(state) == (
        not states.is_transitional(state) or state == SandboxState.KILLING
    )
    if states.is_up(state):
        assert not t.can_resume(state)
    # E2B's two states: "paused" is what a connect resumes (a failed sandbox included: never
    # "running", which would promise a pod that answers).
    assert (state.e2b == "paused") == states.is_resumable(state)
    assert state.e2b in ("running", "paused")


def test_the_deadline_rule() -> None:
    assert deadline_after(NOW, 300) == NOW + timedelta(seconds=300)
    assert deadline_after(NOW, 0) == NOW  # E2B's set_timeout(0): expire now
    done = t.running(op="resume", cmd_msg_id=MSG, host="127.0.0.9", pod_uid="u", timeout=60)(
        record(SandboxState.RESUMING, pending=owned("resume"))
    )
    assert done.deadline == deadline_after(done.started_at, 60)


def test_retention_applies_to_paused_and_failed_creates_only() -> None:
    assert is_retained(record(SandboxState.PAUSED))
    assert is_retained(record(SandboxState.FAILED, failure="create: no such template"))
    assert not is_retained(record(SandboxState.FAILED, failure="pause: envd down"))
    assert not is_retained(record(SandboxState.RUNNING))


def test_a_refused_pause_runs_on_with_the_reason_and_a_fresh_timeout() -> None:
    before = record(SandboxState.PAUSING, pending=owned("pause"), deadline=NOW, timeout=60)
    after = t.pause_refused(MSG, REFUSAL)(before)
    assert after.state == SandboxState.RUNNING and after.generation == GEN + 1
    assert after.refused_pause == REFUSAL and after.pending is None
    assert after.deadline is not None and after.deadline > deadline_after(NOW, 59)
    resumed = t.running(op="resume", cmd_msg_id=MSG, host="h", pod_uid="u")(
        after.model_copy(update={"state": SandboxState.RESUMING, "pending": owned("resume")})
    )
    assert resumed.refused_pause is None


def test_a_failed_resume_stays_paused_with_its_snapshot_and_the_reason() -> None:
    retain = NOW + timedelta(days=1)
    before = record(
        SandboxState.RESUMING,
        pending=owned("resume"),
        snapshot=snapshot(),
        paused_at=NOW,
        retain_until=retain,
    )
    after = t.resume_failed(MSG, "ready command failed: exit 3: not yet")(before)
    assert after.state == SandboxState.PAUSED and after.generation == GEN + 1
    assert after.snapshot == before.snapshot and after.paused_at == NOW
    assert after.retain_until == retain and after.pending is None
    assert after.failure == "resume: ready command failed: exit 3: not yet"
    with pytest.raises(IllegalTransition):  # owned by another command
        t.resume_failed("cmd-2", "x")(before)
    # Resumed from ``failed`` without a snapshot: nothing to go back to.
    bare = record(SandboxState.RESUMING, pending=owned("resume"))
    assert not t.can_fail_back_to_paused(bare)
    with pytest.raises(IllegalTransition):
        t.resume_failed(MSG, "x")(bare)
    resumed = t.running(op="resume", cmd_msg_id=MSG, host="h", pod_uid="u")(
        after.model_copy(update={"state": SandboxState.RESUMING, "pending": owned("resume")})
    )
    assert resumed.failure is None
