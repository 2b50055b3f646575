"""The deliverer's two subscribers: lifecycle events (fan-out to delivery jobs) and the jobs
(one attempt each). Failures propagate to the bus middleware; a delivery's own retries are the
``Retry`` it raises (NAK with the backoff's delay)."""

from __future__ import annotations

from faststream.nats import NatsMessage, NatsRouter

from services.deliverer.delivering import Fanout, Sender
from shared.bus.broker import subscriber_args
from shared.bus.middleware import MSG_ID_HEADER
from shared.bus.topology import DELIVERER_EVENTS, DELIVERER_SEND
from shared.models.webhooks import DeliveryJob


def _delivery(msg: NatsMessage) -> tuple[int, int]:
    md = msg.raw_message.metadata
    return int(md.num_delivered), int(md.sequence.stream)


def build_router(fanout: Fanout, sender: Sender, *, max_workers: int) -> NatsRouter:
    router = NatsRouter()

    @router.subscriber(  # type: ignore[untyped-decorator]
        **subscriber_args(DELIVERER_EVENTS, max_workers=max_workers),
        title="sandbox.evt.* (deliverer)",
        description="Public lifecycle events: one delivery job per webhook that wants it.",
    )
    async def on_event(msg: NatsMessage) -> None:
        _, seq = _delivery(msg)
        headers = msg.raw_message.headers or {}
        await fanout.on_event(
            msg.raw_message.subject, msg.body, msg_id=headers.get(MSG_ID_HEADER), seq=seq
        )

    @router.subscriber(  # type: ignore[untyped-decorator]
        **subscriber_args(DELIVERER_SEND, max_workers=max_workers),
        title="webhook.delivery.*",
        description="One attempt of one delivery: signed POST, history, retry or dead letter.",
    )
    async def on_job(msg: NatsMessage) -> None:
        attempt, _ = _delivery(msg)
        await sender.on_job(DeliveryJob.model_validate_json(msg.body), attempt)

    return router
