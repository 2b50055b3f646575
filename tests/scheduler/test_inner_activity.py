"""Activity inside the sandbox and the ``expiring`` warning in the scheduler's pure decisions:
which signals count is the template's, the deadline it earns is capped at ``maxLifetime`` after
the sandbox started, and the warning goes out once per deadline, ``expiringNotice`` before it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from services.scheduler import expiry, plans
from shared.models.lifecycle import ActivityPolicy, TemplateLifecycle
from shared.models.messages import PauseSandbox, SandboxExpiring
from shared.ports.envd import InnerActivity
from tests.scheduler.test_expiry_rules import ON, POLICY, T0, fired, rec

pytestmark = pytest.mark.unit

DEADLINE = T0 + timedelta(seconds=300)
BUSY = ActivityPolicy(signals=("cpu", "output"), max_lifetime=900, expiring_notice=30)


def seen(**last: float) -> InnerActivity:
    """The daemon's answer, its clock 100 s ahead of ours (ages are taken on its clock)."""
    skew = timedelta(seconds=100)
    now = DEADLINE + skew
    return InnerActivity(now=now, last={k: now - timedelta(seconds=ago) for k, ago in last.items()})


def test_activity_by_a_counted_signal_earns_a_deadline() -> None:
    earned = expiry.earned_deadline(rec(), BUSY, seen(cpu=2), DEADLINE)
    assert earned is not None
    assert earned.seen_at == DEADLINE - timedelta(seconds=2)
    assert earned.deadline == DEADLINE - timedelta(seconds=2) + timedelta(seconds=300)


def test_signals_the_template_does_not_count_earn_nothing() -> None:
    assert expiry.earned_deadline(rec(), BUSY, seen(connections=0, keepalive=0), DEADLINE) is None
    assert expiry.earned_deadline(rec(), ActivityPolicy(), seen(cpu=0), DEADLINE) is None
    assert expiry.earned_deadline(rec(), BUSY, None, DEADLINE) is None  # daemon unreachable


def test_old_activity_earns_nothing() -> None:
    assert expiry.earned_deadline(rec(), BUSY, seen(output=301), DEADLINE) is None


def test_inside_activity_never_passes_the_max_lifetime() -> None:
    """A sandbox busy for ever is still paused ``maxLifetime`` after it started."""
    cap = T0 + timedelta(seconds=900)
    late = rec(deadline=cap - timedelta(seconds=100))
    earned = expiry.earned_deadline(late, BUSY, seen(cpu=0), cap - timedelta(seconds=100))
    assert earned is not None and earned.deadline == cap
    at_cap = rec(deadline=cap)
    assert expiry.earned_deadline(at_cap, BUSY, seen(cpu=0), cap) is None
    # Resumed later: the lifetime counts from the new start.
    resumed = rec(started_at=cap, deadline=cap + timedelta(seconds=300))
    now = cap + timedelta(seconds=300)
    assert expiry.earned_deadline(resumed, BUSY, seen(cpu=0), now) is not None


def test_an_earned_deadline_moves_the_timer_before_any_warning() -> None:
    earned = plans.Earned(deadline=DEADLINE + timedelta(seconds=60), seen_at=DEADLINE)
    watch = plans.Watch(notice=timedelta(seconds=30), earned=earned)
    plan = expiry.on_fired(fired(), rec(), flags=ON, policy=POLICY, now=DEADLINE, watch=watch)
    assert plan.outcome == "kept_busy" and not plan.publish
    assert plan.mutate is not None and plan.mutate(rec()).deadline == earned.deadline
    assert [t.due for t in plan.arm] == [DEADLINE + timedelta(seconds=30)]


def test_expiring_goes_out_within_the_notice_then_the_deadline_expires() -> None:
    watch = plans.Watch(notice=timedelta(seconds=30))
    early = DEADLINE - timedelta(seconds=60)
    moved = expiry.on_fired(fired(), rec(), flags=ON, policy=POLICY, now=early, watch=watch)
    assert moved.outcome == "moved" and moved.arm[0].due == DEADLINE - timedelta(seconds=30)

    now = DEADLINE - timedelta(seconds=29)
    warn = expiry.on_fired(fired(), rec(), flags=ON, policy=POLICY, now=now, watch=watch)
    assert warn.outcome == "expiring" and [t.due for t in warn.arm] == [DEADLINE]
    (out,) = warn.publish
    assert isinstance(out.message, SandboxExpiring) and out.message.decision == "pause"
    assert out.message.deadline == DEADLINE and out.message.notice_seconds == 30
    again = expiry.on_fired(fired(), rec(), flags=ON, policy=POLICY, now=now, watch=watch)
    assert again.publish[0].msg_id == out.msg_id  # once per deadline (the stream deduplicates)

    gone = expiry.on_fired(fired(), rec(), flags=ON, policy=POLICY, now=DEADLINE, watch=watch)
    assert gone.outcome == "expired"
    assert any(isinstance(o.message, PauseSandbox) for o in gone.publish)


def test_without_a_notice_nothing_changes() -> None:
    plan = expiry.on_fired(fired(), rec(), flags=ON, policy=POLICY, now=DEADLINE)
    assert plan.outcome == "expired"
    assert not any(isinstance(o.message, SandboxExpiring) for o in plan.publish)
    synced = expiry.sync(rec(), now=T0, policy=POLICY)
    assert synced.arm[0].due == DEADLINE
    noticed = expiry.sync(rec(), now=T0, policy=POLICY, notice=timedelta(seconds=30))
    assert noticed.arm[0].due == DEADLINE - timedelta(seconds=30)


@pytest.mark.parametrize(
    "raw",
    [
        {"activity": {"signals": ["cpu", "--ro-bind"]}},
        {"activity": {"signals": ["cpu"], "maxLifetime": 10**9}},
        {"activity": {"signals": ["cpu"], "maxLifetime": 0}},
        {"activity": {"expiringNotice": -1}},
        {"activity": {"expiringNotice": 86400}},
        {"activity": {"forever": True}},
    ],
)
def test_hostile_activity_policies_are_refused(raw: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        TemplateLifecycle.model_validate(raw)
