"""The pure decisions in ``services.scheduler.expiry`` (no bus)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.scheduler import expiry, plans
from shared.bus.schedules import Timer
from shared.domain.record import SandboxRecord
from shared.domain.states import SandboxState
from shared.models.lifecycle import ActivityPolicy
from shared.models.messages import KillSandbox, PauseSandbox, SandboxExpired
from shared.ports.envd import InnerActivity
from shared.settings import FeatureFlags

pytestmark = pytest.mark.unit

T0 = datetime(2030, 1, 1, tzinfo=UTC)
POLICY = plans.Policy(
    retention=timedelta(days=30), pause_check=timedelta(seconds=30), pause_attempts=3
)
ON = FeatureFlags(PAUSE_RESUME="true")


def rec(**kw: object) -> SandboxRecord:
    base: dict[str, object] = {
        "sandbox_id": "sbx1",
        "owner": "alice",
        "state": SandboxState.RUNNING,
        "generation": 4,
        "timeout": 300,
        "auto_pause": True,
        "created_at": T0,
        "started_at": T0,
        "deadline": T0 + timedelta(seconds=300),
        "updated_at": T0,
    }
    base.update(kw)
    return SandboxRecord.model_validate(base)


def fired(
    kind: str = "timeout", *, gen: int = 4, attempt: int = 0, due: datetime | None = None
) -> Timer:
    return Timer.model_validate(
        {
            "kind": kind,
            "sandbox_id": "sbx1",
            "generation": gen,
            "due": due or T0,
            "attempt": attempt,
        }
    )


@pytest.mark.parametrize(
    ("flag", "owner", "auto_pause", "decision"),
    [
        ("true", "alice", True, "pause"),
        ("alice,bob", "alice", True, "pause"),
        ("bob", "alice", True, "kill"),
        ("false", "alice", True, "kill"),
        ("", "alice", True, "kill"),
        ("true", "alice", False, "kill"),
    ],
)
def test_decide(flag: str, owner: str, auto_pause: bool, decision: str) -> None:
    record = rec(owner=owner, auto_pause=auto_pause)
    assert expiry.decide(record, FeatureFlags(PAUSE_RESUME=flag)) == decision


def test_expiry_publishes_the_event_then_the_pause_and_arms_a_check() -> None:
    record = rec(deadline=T0)
    plan = expiry.on_fired(
        fired(), record, flags=ON, policy=POLICY, now=T0 + timedelta(seconds=0.1)
    )
    assert plan.outcome == "expired"
    event, command = plan.publish
    assert isinstance(event.message, SandboxExpired)
    assert event.message.decision == "pause"
    assert event.msg_id == "expired:sbx1:g4"
    assert event.message.command == "sandbox.cmd.pause.sbx1 pause:sbx1:g4"
    assert isinstance(command.message, PauseSandbox)
    assert command.message.reason == "timeout"
    assert (command.subject, command.msg_id) == ("sandbox.cmd.pause.sbx1", "pause:sbx1:g4")
    (check,) = plan.arm
    assert (check.kind, check.attempt) == ("pause_check", 1)
    assert check.due == T0 + timedelta(seconds=30.1)


def test_kill_decision_arms_nothing() -> None:
    plan = expiry.on_fired(
        fired(), rec(deadline=T0, auto_pause=False), flags=ON, policy=POLICY, now=T0
    )
    assert isinstance(plan.publish[1].message, KillSandbox)
    assert plan.publish[1].msg_id == "kill:sbx1:g4"
    assert plan.arm == ()


@pytest.mark.parametrize(
    "record",
    [
        rec(state=SandboxState.PAUSED, deadline=None),
        rec(state=SandboxState.PAUSING),
        rec(state=SandboxState.CREATING),
        rec(deadline=None),
    ],
)
def test_stale_fires_do_nothing(record: SandboxRecord) -> None:
    plan = expiry.on_fired(fired(), record, flags=ON, policy=POLICY, now=T0 + timedelta(hours=1))
    assert (plan.outcome, plan.publish, plan.arm) == ("stale", (), ())


def test_a_fire_before_the_record_deadline_rearms_there() -> None:
    later = T0 + timedelta(seconds=40)
    plan = expiry.on_fired(fired(), rec(deadline=later), flags=ON, policy=POLICY, now=T0)
    assert plan.outcome == "moved"
    assert plan.publish == ()
    assert [(t.kind, t.due) for t in plan.arm] == [("timeout", later)]


def test_gone_sandboxes_cancel_both_holders() -> None:
    plan = expiry.on_fired(fired(), None, flags=ON, policy=POLICY, now=T0)
    assert plan.cancel == ("timeout", "retention")
    killed = expiry.on_fired(
        fired(), rec(state=SandboxState.KILLED), flags=ON, policy=POLICY, now=T0
    )
    assert killed.outcome == "gone"


def test_pause_check_after_success_is_quiet() -> None:
    paused = rec(state=SandboxState.PAUSED, generation=5, deadline=None)
    plan = expiry.on_fired(fired("pause_check", attempt=1), paused, flags=ON, policy=POLICY, now=T0)
    assert (plan.outcome, plan.publish, plan.arm) == ("paused", (), ())


def test_pause_check_retries_with_a_fresh_id_and_doubling_delay() -> None:
    stuck = rec(deadline=T0)
    plan = expiry.on_fired(fired("pause_check", attempt=1), stuck, flags=ON, policy=POLICY, now=T0)
    assert plan.outcome == "pause_retried"
    assert plan.publish[0].msg_id == "pause:sbx1:g4:a2"
    assert [(t.attempt, t.due - T0) for t in plan.arm] == [(2, timedelta(seconds=60))]


def test_pause_check_gives_up_with_a_kill() -> None:
    stuck = rec(deadline=T0)
    plan = expiry.on_fired(fired("pause_check", attempt=3), stuck, flags=ON, policy=POLICY, now=T0)
    assert plan.outcome == "pause_attempts_exhausted"
    event, kill = plan.publish
    assert isinstance(event.message, SandboxExpired)
    assert (event.message.decision, event.msg_id) == ("kill", "expired:sbx1:g4:kill")
    assert kill.subject == "sandbox.cmd.kill.sbx1"


def test_pause_check_while_pausing_waits_without_a_new_command() -> None:
    pausing = rec(state=SandboxState.PAUSING, deadline=T0)
    plan = expiry.on_fired(
        fired("pause_check", attempt=1), pausing, flags=ON, policy=POLICY, now=T0
    )
    assert (plan.outcome, plan.publish) == ("pause_in_progress", ())
    assert plan.arm[0].attempt == 2


def test_pause_check_finds_it_failed_and_kills() -> None:
    failed = rec(state=SandboxState.FAILED, generation=5, failure="pause: envd unreachable")
    plan = expiry.on_fired(fired("pause_check", attempt=1), failed, flags=ON, policy=POLICY, now=T0)
    assert plan.outcome == "pause_failed"
    assert plan.publish[1].msg_id == "kill:sbx1:g5"


def test_activity_revives_a_sandbox_whose_pause_never_started() -> None:
    revived = rec(deadline=T0 + timedelta(seconds=100))
    plan = expiry.on_fired(
        fired("pause_check", attempt=1), revived, flags=ON, policy=POLICY, now=T0
    )
    assert plan.outcome == "revived"
    assert [t.kind for t in plan.arm] == ["timeout"]


def test_failed_event_kills_only_when_the_pause_was_ours() -> None:
    failed = rec(state=SandboxState.FAILED, generation=5, failure="pause: boom")
    ours = expiry.on_event(
        plans.FailedPause(pending=fired("pause_check", attempt=1)), failed, policy=POLICY, now=T0
    )
    assert ours.outcome == "pause_failed"
    user = expiry.on_event(plans.FailedPause(pending=None), failed, policy=POLICY, now=T0)
    assert (user.outcome, user.publish) == ("not_ours", ())


def test_retention() -> None:
    paused = rec(state=SandboxState.PAUSED, deadline=None, paused_at=T0, retain_until=T0)
    plan = expiry.on_fired(fired("retention"), paused, flags=ON, policy=POLICY, now=T0)
    assert plan.outcome == "retention_expired"
    (kill,) = plan.publish
    assert isinstance(kill.message, KillSandbox)
    assert kill.message.reason == "retention"
    resumed = rec()
    assert (
        expiry.on_fired(fired("retention"), resumed, flags=ON, policy=POLICY, now=T0).outcome
        == "stale"
    )


def test_sync_of_a_paused_record_sets_retain_until_and_swaps_holders() -> None:
    paused = rec(state=SandboxState.PAUSED, deadline=None, paused_at=T0)
    plan = expiry.sync(paused, now=T0, policy=POLICY)
    assert plan.cancel == ("timeout",)
    assert [(t.kind, t.due) for t in plan.arm] == [("retention", T0 + timedelta(days=30))]
    assert plan.mutate is not None
    assert plan.mutate(paused).retain_until == T0 + timedelta(days=30)
    kept = rec(state=SandboxState.PAUSED, deadline=None, paused_at=T0, retain_until=T0)
    assert expiry.sync(kept, now=T0, policy=POLICY).mutate is None  # the scaler's value wins


def test_a_failed_create_is_retained_then_killed_other_failures_are_not() -> None:
    failed = rec(state=SandboxState.FAILED, deadline=None, failure="create: template 'x' not found")
    plan = expiry.sync(failed, now=T0, policy=POLICY)
    assert [(t.kind, t.due) for t in plan.arm] == [("retention", T0 + timedelta(days=30))]
    assert plan.mutate is not None
    held = plan.mutate(failed)
    assert held.retain_until == T0 + timedelta(days=30)
    later = T0 + timedelta(days=31)
    plan = expiry.on_fired(fired("retention"), held, flags=ON, policy=POLICY, now=later)
    assert plan.outcome == "retention_expired"
    (kill,) = plan.publish
    assert isinstance(kill.message, KillSandbox)
    assert kill.message.reason == "retention"
    # A failed pause or resume keeps its pod or snapshot: not swept by retention.
    for failure in ("pause: envd unreachable", "resume: pod not ready"):
        other = rec(state=SandboxState.FAILED, deadline=None, failure=failure)
        assert expiry.sync(other, now=T0, policy=POLICY).outcome == "transitional"
        stale = other.model_copy(update={"retain_until": T0})
        assert (
            expiry.on_fired(fired("retention"), stale, flags=ON, policy=POLICY, now=later).outcome
            == "stale"
        )


def test_sync_of_a_running_record_arms_its_deadline_and_clears_retention() -> None:
    running = rec(retain_until=T0)
    plan = expiry.sync(running, now=T0, policy=POLICY)
    assert [(t.kind, t.due) for t in plan.arm] == [("timeout", running.deadline)]
    assert plan.cancel == ("retention",)
    assert plan.mutate is not None
    assert plan.mutate(running).retain_until is None
    assert expiry.sync(rec(), now=T0, policy=POLICY).cancel == ()


def test_sync_keeps_a_pending_pause_check_of_an_expired_sandbox() -> None:
    expired = rec(deadline=T0)
    check = fired("pause_check", attempt=1)
    plan = expiry.sync(expired, now=T0 + timedelta(seconds=1), policy=POLICY, pending=check)
    assert (plan.outcome, plan.arm) == ("expiry_in_progress", ())


def test_activity_only_extends_in_kv() -> None:
    record = rec(deadline=T0 + timedelta(seconds=10), timeout=60)
    plan = expiry.on_event(plans.Activity(at=T0), record, policy=POLICY, now=T0)
    assert (plan.outcome, plan.arm) == ("extended", ())
    assert plan.mutate is not None
    assert plan.mutate(record).deadline == T0 + timedelta(seconds=60)
    old = expiry.on_event(
        plans.Activity(at=T0 - timedelta(minutes=5)), record, policy=POLICY, now=T0
    )
    assert old.outcome == "unchanged"  # never shortens


def test_activity_from_before_a_client_set_the_deadline_never_undoes_it() -> None:
    """set_timeout(0) right after a request: that request's activity event comes after it."""
    expired_now = rec(deadline=T0, deadline_set_at=T0, timeout=60)
    late = expiry.on_event(
        plans.Activity(at=T0 - timedelta(milliseconds=5)), expired_now, policy=POLICY, now=T0
    )
    assert (late.outcome, late.mutate) == ("unchanged", None)
    after = expiry.on_event(plans.Activity(at=T0), expired_now, policy=POLICY, now=T0)
    assert after.outcome == "extended"  # activity since counts again


def test_an_activity_plan_made_before_a_set_timeout_does_not_undo_it_when_applied() -> None:
    """The scheduler planned from a read taken before the client's ``set_timeout(0)``; the
    mutation runs on the record as it is then, and keeps the client's deadline (CI saw the
    sandbox stay up for its whole timeout)."""
    before = rec(deadline=T0 + timedelta(seconds=10), timeout=60)
    plan = expiry.on_event(
        plans.Activity(at=T0 - timedelta(milliseconds=5)), before, policy=POLICY, now=T0
    )
    assert plan.outcome == "extended" and plan.mutate is not None
    set_to_now = rec(deadline=T0, deadline_set_at=T0, timeout=60)
    assert plan.mutate(set_to_now) == set_to_now


def test_inner_activity_from_before_a_set_timeout_earns_nothing() -> None:
    busy = ActivityPolicy(signals=("cpu",), max_lifetime=900, expiring_notice=0)
    now = T0 + timedelta(seconds=1)
    seen = InnerActivity(now=now, last={"cpu": now - timedelta(seconds=2)})  # before T0
    set_to_now = rec(deadline=T0, deadline_set_at=T0, timeout=60)
    assert expiry.earned_deadline(set_to_now, busy, seen, now) is None
    # A plan from an older read, applied after the client's set: refused by the mutation.
    earned = expiry.earned_deadline(rec(deadline=T0, timeout=60), busy, seen, now)
    assert earned is not None
    plan = expiry.on_fired(
        fired(),
        rec(deadline=T0, timeout=60),
        flags=ON,
        policy=POLICY,
        now=now,
        watch=plans.Watch(earned=earned),
    )
    assert plan.outcome == "kept_busy" and plan.mutate is not None
    assert plan.mutate(set_to_now) == set_to_now


def test_timer_ids_are_deterministic_and_due_is_utc() -> None:
    naive = Timer.model_validate(
        {"kind": "timeout", "sandbox_id": "sbx1", "generation": 2, "due": "2030-01-01T00:00:00"}
    )
    assert naive.due.tzinfo is not None
    assert naive.msg_id() == "sched:sbx1:g2:2030-01-01T00:00:00+00:00"
    assert naive.holder_subject() == "sandbox.sched.timeout.sbx1"
    assert fired("retention").holder_subject() == "sandbox.sched.retention.sbx1"


@pytest.mark.parametrize(
    ("early_s", "lead_s", "held_s"),
    [
        (0.7, 1.0, 0.7),  # the planned lead: held until due
        (1.9, 1.0, 1.9),  # the lead plus a clock a little behind the server's
        (0.4, 0.0, 0.4),  # no lead, a slow clock: held, not re-armed under the same id
        (2.5, 1.0, None),  # earlier than lead + slack: the record moved, plan now
        (0.0, 1.0, None),  # on time
        (-3.0, 1.0, None),  # late
    ],
)
def test_an_early_fire_is_held_until_due_within_the_lead(
    early_s: float, lead_s: float, held_s: float | None
) -> None:
    timer = fired(due=T0)
    held = expiry.hold_for(timer, T0 - timedelta(seconds=early_s), timedelta(seconds=lead_s))
    assert held == (None if held_s is None else timedelta(seconds=held_s))
