"""``faststream docs gen services.deliverer.asyncapi:app --factory``."""

from __future__ import annotations

from typing import Any

from faststream import FastStream

from services.deliverer.delivering import Fanout, Rules, Sender
from services.deliverer.handlers import build_router
from shared.bus.asyncapi import document
from shared.webhooks.addresses import AddressPolicy
from shared.webhooks.backoff import Backoff


def app() -> FastStream:
    inert: Any = None
    router = build_router(
        Fanout(records=inert, hooks=inert, history=inert, publisher=inert),
        Sender(
            hooks=inert,
            history=inert,
            transport=inert,
            failure=Exception,
            publisher=inert,
            rules=Rules(policy=AddressPolicy(), backoff=Backoff(), max_attempts=1),
        ),
        max_workers=1,
    )
    return document(
        router,
        title="torpor deliverer",
        description="Webhooks: turns public lifecycle events into one delivery job per "
        "registered webhook (webhook.delivery.<webhook id>), POSTs each signed, retries with "
        "backoff, dead-letters to sandbox.dlq.deliverer-send.<sandbox id> (docs/webhooks.md).",
    )
