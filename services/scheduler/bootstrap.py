"""Wiring: broker, KV store, publisher, timers and the two durable subscriptions.

Every replica binds the same two durables (``scheduler-lifecycle`` on SANDBOX_EVT,
``scheduler-fired`` on SANDBOX_TIMERS); the server hands each message to one replica.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import structlog
from faststream.nats import NatsBroker, PullSub
from faststream.nats.annotations import NatsMessage

from services.scheduler import expiry
from services.scheduler.handlers import SchedulerHandlers
from services.scheduler.settings import SchedulerSettings
from services.scheduler.timers import NatsTimers
from shared.bus.broker import key_value, make_broker, prepare, subscriber_args
from shared.bus.publishing import BrokerPublisher
from shared.bus.records import KvSandboxStore
from shared.bus.topology import KV_SANDBOXES, SCHEDULER_FIRED, SCHEDULER_LIFECYCLE, Durable

log = structlog.get_logger()


def policy_of(settings: SchedulerSettings) -> expiry.Policy:
    t = settings.timers
    return expiry.Policy(
        retention=timedelta(seconds=t.retention_seconds),
        pause_check=timedelta(seconds=t.pause_check_seconds),
        pause_attempts=t.pause_attempts,
    )


def _bind(durable: Durable, settings: SchedulerSettings) -> dict[str, Any]:
    """Fetch in batches: one pull round trip per message capped throughput at ~300 msg/s. Order
    does not matter here (every decision re-reads the record), so batches and workers are safe.

    A short fetch wait: when messages are waiting, nats-py returns them at once (no-wait probe);
    when none are, its lingering pull returns only when the batch is full or the wait is over,
    so the wait bounds the extra latency of a lone fired timer."""
    t = settings.timers
    args = subscriber_args(durable, max_workers=t.max_workers)
    return {**args, "pull_sub": PullSub(batch_size=t.fetch_batch, timeout=t.fetch_wait_seconds)}


class SchedulerApp:
    """``await app.start()`` … ``await app.stop()``; ``app.broker`` for readiness checks."""

    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings
        self.broker: NatsBroker = make_broker(settings.bus, service="scheduler")
        self._handlers: SchedulerHandlers | None = None
        lifecycle = _bind(SCHEDULER_LIFECYCLE, settings)
        fired = _bind(SCHEDULER_FIRED, settings)

        # subscriber_args is a dict, so mypy cannot pick a typed overload of subscriber().
        @self.broker.subscriber(**lifecycle)  # type: ignore[untyped-decorator]
        async def on_lifecycle(msg: NatsMessage) -> None:
            await self.handlers.on_event(msg.raw_message.subject, msg.body)

        @self.broker.subscriber(**fired)  # type: ignore[untyped-decorator]
        async def on_fired(msg: NatsMessage) -> None:
            await self.handlers.on_fired(msg.body)

    @property
    def handlers(self) -> SchedulerHandlers:
        if self._handlers is None:  # pragma: no cover - subscribers start after wiring
            msg = "scheduler not started"
            raise RuntimeError(msg)
        return self._handlers

    async def start(self) -> None:
        await prepare(self.broker, self.settings.bus)
        store = KvSandboxStore(await key_value(self.broker, KV_SANDBOXES))
        timers = NatsTimers(
            self.broker.config.connection_state.stream, fired_ttl=self.settings.timers.fired_ttl
        )
        self._handlers = SchedulerHandlers(
            store=store,
            publisher=BrokerPublisher(self.broker),
            timers=timers,
            flags=self.settings.flags,
            policy=policy_of(self.settings),
        )
        await self.broker.start()
        log.info("scheduler_started", pause_resume=self.settings.flags.pause_resume)

    async def ready(self) -> bool:
        return await self.broker.ping(timeout=1.0)

    async def stop(self) -> None:
        await self.broker.stop()
