"""Pure decisions of the scheduler: what a fired timer or a lifecycle event leads to.

No I/O here: every function takes the sandbox record (the truth, from KV), the feature flags and
``now``, and returns a ``Plan`` (messages to publish, timers to arm or cancel, a record change)
that ``services.scheduler.handlers`` carries out.

Rules
-----
- The record's ``deadline`` is the truth; the NATS schedule only has to fire *no later* than it.
  A fire that comes early (the deadline moved on because of activity) re-arms at the record's
  deadline instead of expiring, so activity needs no schedule publish at all (lazy re-arm).
- Expiry (``state == running`` and ``deadline <= now``): **pause** when ``auto_pause`` is set
  and ``PAUSE_RESUME`` is on for the sandbox's owner, otherwise **kill**. The pause command's id
  is ``pause:<sid>:g<gen>``, the same id the API uses for that generation, so a user's pause and a
  timeout pause deduplicate; kill uses ``kill:<sid>:g<gen>``.
- A timeout pause is checked: a ``pause_check`` fires ``pause_check_seconds`` after the command,
  then after doubling delays. Paused (or gone) by then: nothing to do. Still running with its
  deadline passed (the command was lost, or the snapshotter never got to it): the pause is
  ordered again with a fresh id (``pause:<sid>:g<gen>:a<n>``; the first id is deduplicated).
  Transient errors inside one attempt are retried by the snapshotter itself (NAK with backoff);
  when it gives up, the sandbox is ``failed`` with its pod still running, and the state machine
  allows no pause from there. So after ``pause_attempts`` attempts, or as soon as a timeout pause
  ended ``failed`` (``sandbox.evt.failed`` with op ``pause``, or seen at the check), **the
  sandbox is killed**: an expired sandbox is never left running. We chose kill over "pause
  without processes" because such a sandbox would come back missing its processes without
  anyone noticing. The kill is announced with a second ``sandbox.evt.expired``
  (``decision="kill"``, id ``expired:<sid>:g<gen>:kill``).
- Retention: a paused sandbox gets ``retain_until = paused_at + retention`` (written into the
  record, which the APIs show) and a ``retention`` timer; when it fires and the sandbox is still
  paused, it is killed with ``reason="retention"``. A sandbox whose *create* failed (it never
  ran; e.g. a template that vanished) is retained the same way from its failure, so such records
  do not stay forever.
- Activity inside the sandbox (docs/lifecycle-hooks.md § activity): when a timer fires at or
  after ``deadline - expiring_notice`` and the template's activity policy names signals, the
  handler asks the sandbox's daemon when it was last active by them (``Watch.earned``: the
  deadline that activity earns, never past ``started_at + max_lifetime``). Earned: the deadline
  moves there (``kept_busy``). Otherwise, before the deadline, ``sandbox.evt.expiring`` goes out
  once per deadline (id ``expiring:<sid>:g<gen>:<deadline>``) and the timer is armed at the
  deadline itself; at the deadline the sandbox expires as above. With a notice, the timeout timer
  is armed ``expiring_notice`` before the deadline.
- Several replicas: every output has a deterministic message id and every decision re-reads the
  record, so duplicate fires (redelivery, a replica crash) publish nothing new.
- Early fires are held, not re-armed: nats-server fires a schedule up to ~0.5 s late, so the
  timers adapter sets it ``lead`` before the timer's ``due`` (``shared.bus.timers``). A fire
  that arrives before ``due`` by at most ``lead`` plus a second (the slack covers a clock a little
  behind the server's) is held until ``due`` (``hold_for``), then the record is read and the
  plan made as for any fire. Earlier than that, the record moved on (or the 7-day cap): ``moved``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from services.scheduler.effects import (
    clear_retention,
    expired,
    expiring,
    extend_deadline,
    kill,
    pause_check_timer,
    retention_timer,
    set_retention,
    timeout_at,
    timeout_timer,
)
from services.scheduler.plans import (
    NO_WATCH,
    Activity,
    Changed,
    Decision,
    Earned,
    FailedPause,
    Outgoing,
    Plan,
    Policy,
    Watch,
)
from shared.bus.schedules import Holder, Timer
from shared.domain import states
from shared.domain.record import SandboxRecord
from shared.domain.states import SandboxState
from shared.domain.timing import (
    deadline_after,
    is_retained,
    predates_client_deadline,
    retained_until,
)
from shared.models.lifecycle import ActivityPolicy
from shared.models.messages import PauseSandbox
from shared.ports.envd import InnerActivity
from shared.settings import FeatureFlags


def decide(record: SandboxRecord, flags: FeatureFlags) -> Decision:
    if record.auto_pause and flags.pause_resume_enabled_for(record.owner):
        return "pause"
    return "kill"


# ---- fired timers --------------------------------------------------------------------------


def on_fired(
    timer: Timer,
    record: SandboxRecord | None,
    *,
    flags: FeatureFlags,
    policy: Policy,
    now: datetime,
    watch: Watch = NO_WATCH,
) -> Plan:
    if record is None or states.is_gone(record.state):
        return Plan("gone", cancel=("timeout", "retention"))
    if timer.kind == "timeout":
        return _on_timeout(record, flags=flags, policy=policy, now=now, watch=watch)
    if timer.kind == "pause_check":
        return _on_pause_check(timer, record, policy=policy, now=now, notice=watch.notice)
    return _on_retention(record, now=now)


HOLD_SLACK = timedelta(seconds=1)


def hold_for(timer: Timer, now: datetime, lead: timedelta) -> timedelta | None:
    """How long to hold a fire that came before its ``due`` (see the rules above); ``None``:
    decide now. Without the hold, a fire a little early would re-arm the very same timer, whose
    message id the server has just seen: the duplicate would be dropped and the deadline lost."""
    early = timer.due - now
    if early <= timedelta(0) or early > lead + HOLD_SLACK:
        return None
    return early


def needs_watch(record: SandboxRecord | None, now: datetime, notice: timedelta) -> bool:
    """A fired timeout that may warn or expire: the handler asks the daemon about activity."""
    return (
        record is not None
        and states.is_running(record.state)
        and record.deadline is not None
        and record.deadline - notice <= now
    )


def earned_deadline(
    record: SandboxRecord, activity: ActivityPolicy, seen: InnerActivity | None, now: datetime
) -> Earned | None:
    """The deadline that activity inside the sandbox earns by the template's policy: its last
    activity by a counted signal plus the timeout, capped at ``started_at + max_lifetime``;
    ``None`` when that is no later than the current deadline, nothing counted, or the activity
    came before a client last set the deadline."""
    if seen is None or not activity.signals or record.deadline is None:
        return None
    times = [t for s in activity.signals if (t := seen.last.get(s)) is not None]
    if not times:
        return None
    age = max(seen.now - max(times), timedelta(0))  # the daemon's clock: no skew
    seen_at = now - age
    if predates_client_deadline(record, seen_at):
        return None
    wanted = deadline_after(seen_at, record.timeout)
    cap = record.started_at + timedelta(seconds=activity.max_lifetime)
    wanted = min(wanted, cap)
    if wanted <= record.deadline or wanted <= now:
        return None
    return Earned(deadline=wanted, seen_at=seen_at)


def _on_timeout(
    record: SandboxRecord,
    *,
    flags: FeatureFlags,
    policy: Policy,
    now: datetime,
    watch: Watch = NO_WATCH,
) -> Plan:
    if not states.is_running(record.state) or record.deadline is None:
        return Plan("stale")
    if record.deadline - watch.notice > now:
        return Plan("moved", arm=(timeout_timer(record, watch.notice),))
    if watch.earned is not None:
        return Plan(
            "kept_busy",
            mutate=extend_deadline(watch.earned.deadline, watch.earned.seen_at),
            arm=(timeout_at(record, watch.earned.deadline - watch.notice),),
        )
    if record.deadline > now:  # within the notice: warn once, then wait for the deadline itself
        return Plan(
            "expiring",
            publish=(expiring(record, decide(record, flags), now, watch.notice),),
            arm=(timeout_at(record, record.deadline),),
        )
    decision = decide(record, flags)
    command: Outgoing
    if decision == "pause":
        command = Outgoing.of(_timeout_pause(record))
        check = pause_check_timer(record, attempt=1, due=now + check_delay(policy, 1))
        arm: tuple[Timer, ...] = (check,)
    else:
        command = kill(record, "timeout")
        arm = ()
    return Plan(
        "expired",
        publish=(expired(record, decision, now, command), command),
        arm=arm,
        decision=decision,
        deadline=record.deadline,
    )


def _timeout_pause(record: SandboxRecord) -> PauseSandbox:
    """The pause a timeout sends: it keeps memory when the sandbox was created asking for it."""
    return PauseSandbox(
        sandbox_id=record.sandbox_id,
        generation=record.generation,
        reason="timeout",
        memory=record.auto_pause_memory,
    )


def _on_pause_check(
    timer: Timer,
    record: SandboxRecord,
    *,
    policy: Policy,
    now: datetime,
    notice: timedelta = timedelta(0),
) -> Plan:
    if record.state == SandboxState.FAILED:
        if _failed_our_pause(record, timer):
            return _give_up(record, now, "pause_failed")
        return Plan("not_ours")
    if _refused_our_pause(record, timer):
        # A prePause hook refused it (a fresh deadline on the record): this check holds the
        # sandbox's only timer, so the timeout is armed again or it would never expire.
        return Plan("refused", arm=(timeout_timer(record, notice),))
    if record.generation != timer.generation or record.state == SandboxState.PAUSED:
        return Plan("paused")  # the pause went through (generation moved on)
    if states.is_running(record.state) and record.deadline is not None and record.deadline > now:
        # Activity revived it before the pause started: back to an ordinary deadline.
        return Plan("revived", arm=(timeout_timer(record, notice),))
    if timer.attempt >= policy.pause_attempts:
        return _give_up(record, now, "pause_attempts_exhausted")
    attempt = timer.attempt + 1
    check = pause_check_timer(record, attempt=attempt, due=now + check_delay(policy, attempt))
    if not states.is_running(record.state):
        return Plan("pause_in_progress", arm=(check,))  # pausing (or resuming): look again later
    retry = Outgoing.of(
        _timeout_pause(record),
        f"a{attempt}",  # a fresh id: the first one is deduplicated
    )
    return Plan("pause_retried", publish=(retry,), arm=(check,))


def check_delay(policy: Policy, attempt: int) -> timedelta:
    """Backoff between pause attempts: ``pause_check * 2**(attempt-1)``."""
    return policy.pause_check * float(2 ** max(0, attempt - 1))


def _refused_our_pause(record: SandboxRecord, timer: Timer) -> bool:
    """A refusal moves the generation on and leaves the sandbox running with the outcome kept
    (a later pause or resume clears it, and a resume arms its own timer)."""
    return (
        states.is_running(record.state)
        and record.refused_pause is not None
        and record.deadline is not None
        and record.generation > timer.generation
    )


def _failed_our_pause(record: SandboxRecord, timer: Timer) -> bool:
    """A failed pause moves the generation on by one (so a user retry gets a fresh id)."""
    return (record.failure or "").startswith("pause") and record.generation in (
        timer.generation,
        timer.generation + 1,
    )


def _give_up(record: SandboxRecord, now: datetime, outcome: str) -> Plan:
    command = kill(record, "timeout")
    return Plan(
        outcome,
        publish=(expired(record, "kill", now, command, "kill"), command),
        decision="kill",
    )


def _on_retention(record: SandboxRecord, *, now: datetime) -> Plan:
    if not is_retained(record) or record.retain_until is None:
        return Plan("stale")
    if record.retain_until > now:
        return Plan("moved", arm=(retention_timer(record, record.retain_until),))
    return Plan("retention_expired", publish=(kill(record, "retention"),))


# ---- lifecycle events ----------------------------------------------------------------------


def on_event(
    event: Activity | FailedPause | Changed,
    record: SandboxRecord | None,
    *,
    policy: Policy,
    now: datetime,
    notice: timedelta = timedelta(0),
) -> Plan:
    if record is None or states.is_gone(record.state):
        return Plan("gone", cancel=("timeout", "retention"))
    if isinstance(event, Activity):
        return _on_activity(event, record, notice)
    if isinstance(event, FailedPause):
        return _on_failed_pause(event.pending, record, now=now)
    return sync(record, now=now, policy=policy, pending=event.pending, notice=notice)


def _on_activity(event: Activity, record: SandboxRecord, notice: timedelta) -> Plan:
    if not states.is_running(record.state):
        return Plan("ignored")
    if predates_client_deadline(record, event.at):
        return Plan("unchanged")
    wanted = deadline_after(event.at, record.timeout)
    if record.deadline is None:
        # No deadline at all: set one and arm it (the only activity that publishes a schedule).
        return Plan(
            "deadline_set",
            mutate=extend_deadline(wanted, event.at),
            arm=(timeout_at(record, wanted - notice),),
        )
    if wanted <= record.deadline:
        return Plan("unchanged")
    # Lazy: the pending schedule fires at the old deadline and re-arms at the record's.
    return Plan("extended", mutate=extend_deadline(wanted, event.at))


def _on_failed_pause(pending: Timer | None, record: SandboxRecord, *, now: datetime) -> Plan:
    """A pause failed: if it was ours (a ``pause_check`` is pending), kill without waiting."""
    if pending is None or pending.kind != "pause_check":
        return Plan("not_ours")  # a user's pause failed: the sandbox just stays failed
    if record.state == SandboxState.FAILED and _failed_our_pause(record, pending):
        return _give_up(record, now, "pause_failed")
    return Plan("not_ours")


def needs_pending(record: SandboxRecord | None, now: datetime) -> bool:
    """Whether ``sync`` must know the pending timeout-holder timer (a running sandbox past its
    deadline may be mid-expiry: its holder then carries a ``pause_check`` to keep)."""
    return (
        record is not None
        and states.is_running(record.state)
        and record.deadline is not None
        and record.deadline <= now
    )


def sync(
    record: SandboxRecord,
    *,
    now: datetime,
    policy: Policy,
    pending: Timer | None = None,
    notice: timedelta = timedelta(0),
) -> Plan:
    """Make the schedules match the record: timeout while running, retention while paused."""
    if states.is_running(record.state):
        # retain_until is set exactly while a retention timer may be pending (see below).
        retained = record.retain_until is not None
        clear = clear_retention if retained else None
        cancel: tuple[Holder, ...] = ("retention",) if retained else ()
        if record.deadline is None:
            return Plan("no_deadline", cancel=cancel, mutate=clear)
        if record.deadline <= now and pending is not None and pending.kind == "pause_check":
            return Plan("expiry_in_progress", cancel=cancel, mutate=clear)
        return Plan("armed", arm=(timeout_timer(record, notice),), cancel=cancel, mutate=clear)
    if is_retained(record):
        since = record.paused_at if record.state == SandboxState.PAUSED else record.updated_at
        retain_until = record.retain_until or retained_until(since or now, policy.retention)
        mutate = None if record.retain_until is not None else set_retention(retain_until)
        return Plan(
            "retained",
            arm=(retention_timer(record, retain_until),),
            cancel=("timeout",),
            mutate=mutate,
        )
    # creating, pausing, resuming, failed (but not a failed create): the next event settles it
    return Plan("transitional")
