"""What the deliverer decides: which webhooks an event goes to (fan-out), and what one attempt
of one delivery does (send, record, retry later, or dead-letter with the reason).

Exactly-once is not promised to receivers, at-least-once is: the fan-out of a redelivered event
is the same job (its message id is ``<webhook id>:<event id>``), and an attempt that succeeds
just before a crash is sent again. Every delivery of one event carries the same event id
(``Torpor-Event-Id`` and ``id`` in the body) for receivers to de-duplicate on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

import structlog
from prometheus_client import CollectorRegistry

from services.deliverer.metrics import DelivererMetrics
from shared.bus import subjects
from shared.bus.retry import Retry
from shared.models.public_events import public_event
from shared.models.webhooks import (
    DeadLetteredDelivery,
    DeliveryJob,
    DeliveryRecord,
    DeliveryState,
    Webhook,
)
from shared.ports.bus import Publisher, SandboxStore
from shared.ports.webhooks import DeliveryLog, WebhookStore
from shared.redaction import redact_text
from shared.webhooks.addresses import (
    AddressPolicy,
    RefusedUrl,
    Resolver,
    Target,
    checked_addresses,
    parse_url,
    system_resolver,
)
from shared.webhooks.backoff import Backoff
from shared.webhooks.signing import SIGNATURE_HEADER, sign

log = structlog.get_logger()

Clock = Callable[[], datetime]
USER_AGENT = "torpor-webhooks/1"
DLQ_CONSUMER = "deliverer-send"


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Answer(Protocol):
    @property
    def status(self) -> int: ...


class Transport(Protocol):
    async def post(
        self, target: Target, address: str, body: bytes, headers: dict[str, str]
    ) -> Answer:
        """The receiver's HTTP status; ``DeliveryFailed`` when there is none."""
        ...


class Fanout:
    def __init__(
        self,
        *,
        records: SandboxStore,
        hooks: WebhookStore,
        history: DeliveryLog,
        publisher: Publisher,
        clock: Clock = _utcnow,
        metrics: DelivererMetrics | None = None,
    ) -> None:
        self._metrics = metrics if metrics is not None else DelivererMetrics(CollectorRegistry())
        self._records = records
        self._hooks = hooks
        self._history = history
        self._publisher = publisher
        self._clock = clock

    async def on_event(self, subject: str, data: bytes, *, msg_id: str | None, seq: int) -> int:
        """One delivery job per enabled webhook of the sandbox's owner that wants this type."""
        record = await self._records.get(subjects.sandbox_id_of(subject))
        if record is None:
            log.info("webhook_event_unattributed", subject=subject)  # its record is long gone
            return 0
        event = public_event(
            subject, data, event_id=msg_id, seq=seq, owner=record.owner, template=record.template
        )
        if event is None:
            return 0
        hooks = [h for h in await self._hooks.list(record.owner) if h.wants(event.type)]
        body = event.body().decode()
        for hook in hooks:
            job = DeliveryJob(
                webhook_id=hook.id,
                owner=hook.owner,
                event_id=event.id,
                event_type=event.type,
                sandbox_id=event.sandbox_id,
                body=body,
            )
            if await self._history.get(hook.id, event.id) is None:
                now = self._clock()
                await self._history.put(
                    DeliveryRecord(
                        webhook_id=hook.id,
                        event_id=event.id,
                        event_type=event.type,
                        sandbox_id=event.sandbox_id,
                        state="pending",
                        created_at=now,
                        updated_at=now,
                    )
                )
            if await self._publisher.publish(
                job, f"{subjects.WEBHOOK_DELIVERY}.{hook.id}", msg_id=f"{hook.id}:{event.id}"
            ):
                self._metrics.fanned_out.inc()
        return len(hooks)


@dataclass(frozen=True)
class Rules:
    policy: AddressPolicy
    backoff: Backoff
    max_attempts: int


class Sender:
    def __init__(
        self,
        *,
        hooks: WebhookStore,
        history: DeliveryLog,
        transport: Transport,
        failure: type[Exception],
        publisher: Publisher,
        rules: Rules,
        resolver: Resolver = system_resolver,
        clock: Clock = _utcnow,
        now: Callable[[], float] = time.time,
        metrics: DelivererMetrics | None = None,
    ) -> None:
        self._metrics = metrics if metrics is not None else DelivererMetrics(CollectorRegistry())
        self._hooks = hooks
        self._history = history
        self._transport = transport
        self._failure = failure
        self._publisher = publisher
        self._rules = rules
        self._resolver = resolver
        self._clock = clock
        self._now = now

    async def on_job(self, job: DeliveryJob, attempt: int) -> DeliveryState:
        """One attempt (``attempt`` counts from 1). Raises ``Retry`` to be tried again later."""
        hook = await self._hooks.get(job.owner, job.webhook_id)
        if hook is None or not hook.wants(job.event_type):
            why = "the webhook was deleted" if hook is None else "the webhook no longer wants it"
            return await self._record(job, "dropped", attempt - 1, error=why)
        try:
            target = parse_url(hook.url)
            addresses = await checked_addresses(target, self._rules.policy, self._resolver)
        except RefusedUrl as e:
            # Checked at registration: the name now resolves somewhere it may not go.
            return await self._dead_letter(job, attempt, str(e))
        status: int | None = None
        started = time.monotonic()
        try:
            answer = await self._transport.post(
                target, addresses[0], job.body.encode(), self._headers(hook, job, attempt)
            )
            status = answer.status
            reason = None if 200 <= status < 300 else f"HTTP {status}"
        except self._failure as e:
            reason = redact_text(str(e))[:300]
        finally:
            self._metrics.attempt_seconds.observe(time.monotonic() - started)
        if reason is None:
            return await self._record(job, "delivered", attempt, status=status)
        if attempt >= self._rules.max_attempts:
            return await self._dead_letter(job, attempt, reason, status=status)
        delay = self._rules.backoff.delay(attempt)
        await self._record(
            job,
            "retrying",
            attempt,
            status=status,
            error=reason,
            next_at=self._clock() + timedelta(seconds=delay),
        )
        raise Retry(f"webhook {job.webhook_id}: {reason}", delay=delay)

    def _headers(self, hook: Webhook, job: DeliveryJob, attempt: int) -> dict[str, str]:
        return {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "Torpor-Webhook-Id": hook.id,
            "Torpor-Event-Id": job.event_id,
            "Torpor-Event-Type": job.event_type,
            "Torpor-Delivery-Attempt": str(attempt),
            SIGNATURE_HEADER: sign(hook.secret, job.body.encode(), int(self._now())),
        }

    async def _dead_letter(
        self, job: DeliveryJob, attempt: int, reason: str, *, status: int | None = None
    ) -> DeliveryState:
        letter = DeadLetteredDelivery(
            sandbox_id=job.sandbox_id,
            webhook_id=job.webhook_id,
            event_id=job.event_id,
            event_type=job.event_type,
            attempts=attempt,
            reason=reason,
            body=job.body,
        )
        await self._publisher.publish(
            letter,
            f"{subjects.DLQ_PREFIX}.{DLQ_CONSUMER}.{job.sandbox_id}",
            msg_id=f"dlq:webhook:{job.webhook_id}:{job.event_id}",
        )
        log.warning(
            "webhook_dead_lettered",
            webhook_id=job.webhook_id,
            event_id=job.event_id,
            attempts=attempt,
            reason=reason,
        )
        return await self._record(job, "dead_lettered", attempt, status=status, error=reason)

    async def _record(
        self,
        job: DeliveryJob,
        state: DeliveryState,
        attempts: int,
        *,
        status: int | None = None,
        error: str | None = None,
        next_at: datetime | None = None,
    ) -> DeliveryState:
        now = self._clock()
        before = await self._history.get(job.webhook_id, job.event_id)
        await self._history.put(
            DeliveryRecord(
                webhook_id=job.webhook_id,
                event_id=job.event_id,
                event_type=job.event_type,
                sandbox_id=job.sandbox_id,
                state=state,
                attempts=attempts,
                last_status=status,
                last_error=error,
                next_attempt_at=next_at,
                created_at=before.created_at if before else now,
                updated_at=now,
            )
        )
        self._metrics.attempts.labels(state).inc()
        log.info(
            "webhook_delivery",
            webhook_id=job.webhook_id,
            event_id=job.event_id,
            state=state,
            attempt=attempts,
            status=status,
        )
        return state
