"""Composition root of the deliverer: KV adapters, the HTTP transport and the rules in, a worker
out. Every replica binds the same two durables (``deliverer-events``, ``deliverer-send``)."""

from __future__ import annotations

from faststream.nats import NatsRouter

from services.deliverer.delivering import Fanout, Rules, Sender
from services.deliverer.handlers import build_router
from services.deliverer.metrics import DelivererMetrics
from services.deliverer.sending import DeliveryFailed, HttpTransport
from services.deliverer.settings import DelivererSettings
from shared.bus.kv import LazyBucket
from shared.bus.topology import KV_DELIVERIES, KV_WEBHOOKS
from shared.bus.webhooks import KvDeliveryLog, KvWebhookStore
from shared.lifecycle.hosting import Context, Parts, WorkerHost
from shared.webhooks.backoff import Backoff
from shared.webhooks.settings import WebhookPolicySettings


def rules_of(settings: DelivererSettings, policy: WebhookPolicySettings) -> Rules:
    return Rules(
        policy=policy.policy(),
        backoff=Backoff(base=settings.backoff_base_seconds, cap=settings.backoff_cap_seconds),
        max_attempts=settings.max_attempts,
    )


def deliverer_host(
    ctx: Context, settings: tuple[DelivererSettings, WebhookPolicySettings]
) -> WorkerHost:
    own, policy = settings
    rules = rules_of(own, policy)
    metrics = DelivererMetrics(ctx.registry)  # once per host: its builds share it

    def build(parts: Parts) -> NatsRouter:
        js = parts.broker.config.connection_state.stream
        hooks = KvWebhookStore(LazyBucket(js, KV_WEBHOOKS))
        history = KvDeliveryLog(LazyBucket(js, KV_DELIVERIES))
        fanout = Fanout(
            records=parts.store,
            hooks=hooks,
            history=history,
            publisher=parts.publisher,
            metrics=metrics,
        )
        sender = Sender(
            hooks=hooks,
            history=history,
            transport=HttpTransport(timeout=own.timeout_seconds),
            failure=DeliveryFailed,
            publisher=parts.publisher,
            rules=rules,
            metrics=metrics,
        )
        return build_router(fanout, sender, max_workers=own.max_workers)

    return WorkerHost(service="deliverer", bus=ctx.bus, build=build)
