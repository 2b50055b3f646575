"""The scheduler's two message handlers: lifecycle events and fired timers.

Each handler re-reads the sandbox record, asks ``expiry`` for a ``Plan`` and carries it out:
record change, publishes (PubAck awaited), cancels, arms. Messages come in batches
(``shared.bus.batches``): a batch's messages are handled concurrently and each one's exception
is its outcome (NAK with backoff, or a dead letter; the plan is recomputed on redelivery and every
output is idempotent).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol, TypeVar

import structlog
from prometheus_client import CollectorRegistry

from services.scheduler import expiry, plans
from services.scheduler.metrics import SchedulerMetrics
from shared.bus import subjects
from shared.bus.batches import Delivery, Outcome
from shared.bus.schedules import Holder, Timer
from shared.domain.record import SandboxRecord
from shared.errors import EnvdError, EnvdUnavailable, NotFound
from shared.models.lifecycle import (
    DEFAULT_ACTIVITY,
    ActivityPolicy,
    TemplateFacts,
    unknown_template,
)
from shared.models.messages import SandboxActivity, SandboxFailed
from shared.ports.bus import Publisher, SandboxStore
from shared.ports.envd import Envd
from shared.ports.workloads import Endpoint
from shared.settings import FeatureFlags

log = structlog.get_logger()

Clock = Callable[[], datetime]

_SYNC_ROUNDS = 3
_TEMPLATE_TTL = 5.0  # seconds a template's activity policy is cached
_ACTIVITY_TIMEOUT = 2.0  # seconds to wait for a daemon's activity answer


BucketVersion = Callable[[], Awaitable[int]]


class Timers(Protocol):
    async def arm(self, timer: Timer) -> None: ...

    async def cancel(self, sandbox_id: str, holder: Holder) -> None: ...

    async def pending(self, sandbox_id: str, holder: Holder) -> Timer | None: ...


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _timer_view(record: SandboxRecord | None) -> tuple[object, ...]:
    """The record fields the schedules depend on."""
    if record is None:
        return ()
    return (record.state, record.generation, record.deadline, record.retain_until, record.paused_at)


class SchedulerHandlers:
    def __init__(
        self,
        *,
        store: SandboxStore,
        publisher: Publisher,
        timers: Timers,
        flags: FeatureFlags,
        policy: plans.Policy,
        clock: Clock = _utcnow,
        templates: Callable[[str], TemplateFacts] = unknown_template,
        envd: Envd | None = None,
        records_version: BucketVersion | None = None,
        lead: timedelta = timedelta(0),
        metrics: SchedulerMetrics | None = None,
    ) -> None:
        self._metrics = metrics if metrics is not None else SchedulerMetrics(CollectorRegistry())
        self._store = store
        self._publisher = publisher
        self._timers = timers
        self._flags = flags
        self._policy = policy
        self._clock = clock
        self._templates = templates
        self._facts: dict[str, tuple[float, TemplateFacts]] = {}
        self._envd = envd  # asks a sandbox's daemon about activity inside it
        # The sequence of the records bucket's last write: a batch whose records did not move
        # while it armed needs no re-read per sandbox (see on_event_batch).
        self._records_version = records_version
        self._lead = lead  # how early the timers adapter has schedules fire (expiry.hold_for)

    def _activity_policy(self, record: SandboxRecord | None) -> ActivityPolicy:
        """The template's activity policy (templates re-read at most every few seconds)."""
        if record is None:
            return DEFAULT_ACTIVITY
        now = time.monotonic()
        cached = self._facts.get(record.template)
        if cached is None or cached[0] < now:
            if len(self._facts) > 1024:
                self._facts.clear()
            cached = (now + _TEMPLATE_TTL, self._templates(record.template))
            self._facts[record.template] = cached
        return cached[1].activity

    def _notice(self, record: SandboxRecord | None) -> timedelta:
        return timedelta(seconds=self._activity_policy(record).expiring_notice)

    async def _watch(
        self, timer: Timer, record: SandboxRecord | None, now: datetime
    ) -> plans.Watch:
        policy = self._activity_policy(record)
        notice = timedelta(seconds=policy.expiring_notice)
        if (
            record is None
            or timer.kind != "timeout"
            or not policy.signals
            or self._envd is None
            or not (record.host and record.pod_uid)
            or not expiry.needs_watch(record, now, notice)
        ):
            return plans.Watch(notice=notice)
        try:
            seen = await self._envd.activity(
                Endpoint(host=record.host, pod_uid=record.pod_uid),
                access_token=record.envd_access_token,
                timeout=_ACTIVITY_TIMEOUT,
            )
        except (EnvdUnavailable, EnvdError) as e:  # no answer: nothing inside counts
            log.info("activity_unknown", sandbox_id=record.sandbox_id, error=str(e))
            seen = None
        earned = expiry.earned_deadline(record, policy, seen, now)
        return plans.Watch(notice=notice, earned=earned)

    async def on_fired(self, body: bytes) -> str:
        timer = Timer.model_validate_json(body)  # a ValidationError dead-letters the message
        hold = expiry.hold_for(timer, self._clock(), self._lead)
        if hold is not None:  # fired early on purpose: decide at the due time, on a fresh read
            await asyncio.sleep(hold.total_seconds())
        record = await self._store.get(timer.sandbox_id)
        # After a hold it is due, even if the clock reads a hair earlier: "moved" would re-arm
        # this very timer, an id the server just saw (the duplicate would be dropped).
        now = self._clock() if hold is None else max(self._clock(), timer.due)
        watch = await self._watch(timer, record, now)
        plan = expiry.on_fired(
            timer, record, flags=self._flags, policy=self._policy, now=now, watch=watch
        )
        await self._execute(timer.sandbox_id, plan)
        self._metrics.fired.labels(timer.kind, plan.outcome).inc()
        if plan.decision is not None:
            self._metrics.expiries.labels(plan.decision).inc()
            if plan.deadline is not None:
                self._metrics.lateness.observe((now - plan.deadline).total_seconds())
            log.info(
                "sandbox_expired",
                sandbox_id=timer.sandbox_id,
                decision=plan.decision,
                outcome=plan.outcome,
                generation=record.generation if record else None,
            )
        elif plan.outcome == "retention_expired":
            self._metrics.retention_kills.inc()
            log.info("retention_expired", sandbox_id=timer.sandbox_id)
        if plan.arm and not plan.publish:
            # A re-arm raced with a lifecycle event? Make the schedule match the latest record.
            await self._settle(timer.sandbox_id, record, plan)
        return plan.outcome

    async def on_event(self, subject: str, body: bytes) -> str:
        outcome, settle = await self._on_event(subject, body)
        if settle is not None:
            await self._settle(*settle)
        return outcome

    async def on_event_batch(self, batch: Sequence[Delivery]) -> list[Outcome]:
        """A batch of lifecycle events, handled concurrently; one outcome per message.

        Arming a schedule from a record that changed meanwhile must be corrected (``_settle``:
        one more KV read per sandbox). When the records bucket saw no write at all between
        before the first read and after the last arm, no record can have changed: the whole
        batch is settled by two requests instead of one per sandbox."""
        mark = await self._records_version() if self._records_version else None
        done = await asyncio.gather(*(_guarded(self._on_event_of(d)) for d in batch))
        outcomes: list[Outcome] = [o for o, _ in done]
        unsettled = [(i, s) for i, (o, s) in enumerate(done) if o is None and s is not None]
        if not unsettled:
            return outcomes
        if mark is not None and self._records_version is not None:
            try:
                if await self._records_version() == mark:
                    return outcomes
            except Exception as e:  # the whole batch is retried: nothing is lost
                return [e] * len(batch)
        settled = await asyncio.gather(
            *(_guarded(self._settle_of(batch[i], s)) for i, s in unsettled)
        )
        for (i, _), (error, _) in zip(unsettled, settled, strict=True):
            outcomes[i] = error
        return outcomes

    async def on_fired_batch(self, batch: Sequence[Delivery]) -> list[Outcome]:
        """A batch of fired timers, handled concurrently; one outcome per message."""
        done = await asyncio.gather(*(_guarded(self._on_fired_of(d)) for d in batch))
        return [o for o, _ in done]

    async def _on_event_of(self, d: Delivery) -> _Settle | None:
        with structlog.contextvars.bound_contextvars(**d.log_context):
            return (await self._on_event(d.subject, d.data))[1]

    async def _settle_of(self, d: Delivery, settle: _Settle) -> None:
        with structlog.contextvars.bound_contextvars(**d.log_context):
            await self._settle(*settle)

    async def _on_fired_of(self, d: Delivery) -> None:
        with structlog.contextvars.bound_contextvars(**d.log_context):
            await self.on_fired(d.data)

    async def _on_event(self, subject: str, body: bytes) -> tuple[str, _Settle | None]:
        sandbox_id = subjects.sandbox_id_of(subject)
        name = subject.rsplit(".", 2)[-2]
        record = await self._store.get(sandbox_id)
        now = self._clock()
        event: plans.Activity | plans.FailedPause | plans.Changed
        if subject.startswith(subjects.EVT_ACTIVITY + "."):
            event = plans.Activity(at=SandboxActivity.model_validate_json(body).at)
        elif subject.startswith(subjects.EVT_FAILED + "."):
            failed = SandboxFailed.model_validate_json(body)
            if failed.op != "pause":
                event = plans.Changed()
            else:
                event = plans.FailedPause(pending=await self._timers.pending(sandbox_id, "timeout"))
        else:
            pending = None
            if expiry.needs_pending(record, now):
                pending = await self._timers.pending(sandbox_id, "timeout")
            event = plans.Changed(pending=pending)
        plan = expiry.on_event(
            event, record, policy=self._policy, now=now, notice=self._notice(record)
        )
        await self._execute(sandbox_id, plan)
        self._metrics.events.labels(name, plan.outcome).inc()
        log.debug("event_handled", sandbox_id=sandbox_id, kind=name, outcome=plan.outcome)
        return plan.outcome, ((sandbox_id, record, plan) if (plan.arm or plan.cancel) else None)

    async def _settle(self, sandbox_id: str, seen: SandboxRecord | None, plan: plans.Plan) -> None:
        """Concurrent handlers may arm from different versions of the record; the last publish
        wins. Re-read after arming and sync again until the record stops moving under us."""
        expected = plan.mutate(seen) if (plan.mutate and seen) else seen
        for _ in range(_SYNC_ROUNDS):
            latest = await self._store.get(sandbox_id)
            if _timer_view(latest) == _timer_view(expected):
                return
            now = self._clock()
            pending = None
            if expiry.needs_pending(latest, now):
                pending = await self._timers.pending(sandbox_id, "timeout")
            again = expiry.on_event(
                plans.Changed(pending=pending),
                latest,
                policy=self._policy,
                now=now,
                notice=self._notice(latest),
            )
            await self._execute(sandbox_id, again)
            expected = again.mutate(latest) if (again.mutate and latest) else latest

    async def _execute(self, sandbox_id: str, plan: plans.Plan) -> None:
        if plan.mutate is not None:
            try:
                await self._store.update(sandbox_id, plan.mutate)
            except NotFound:
                return
        for out in plan.publish:
            await self._publisher.publish(out.message, out.subject, msg_id=out.msg_id)
        for holder in plan.cancel:
            await self._timers.cancel(sandbox_id, holder)
            self._metrics.cancelled.labels(holder).inc()
        for timer in plan.arm:
            await self._timers.arm(timer)
            self._metrics.armed.labels(timer.kind).inc()


_Settle = tuple[str, SandboxRecord | None, plans.Plan]
_T = TypeVar("_T")


async def _guarded(work: Awaitable[_T]) -> tuple[Outcome, _T | None]:
    """One message's failure is its own outcome, never its batch's."""
    try:
        return None, await work
    except Exception as e:
        return e, None
