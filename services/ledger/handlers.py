"""The ledger's one subscriber. One message in flight (the durable's ``max_ack_pending`` is 1 and
one worker): events are applied in stream order, which the arithmetic relies on."""

from __future__ import annotations

from faststream.nats import NatsMessage, NatsRouter

from services.ledger.metering import Ledger
from shared.bus.broker import subscriber_args
from shared.bus.middleware import MSG_ID_HEADER
from shared.bus.topology import LEDGER_EVENTS


def build_router(ledger: Ledger) -> NatsRouter:
    router = NatsRouter()

    @router.subscriber(  # type: ignore[untyped-decorator]
        **subscriber_args(LEDGER_EVENTS, max_workers=1),
        title="sandbox.evt.* (ledger)",
        description="created, paused, resumed, killed, failed: move the sandbox's usage meters.",
    )
    async def on_event(msg: NatsMessage) -> None:
        seq = int(msg.raw_message.metadata.sequence.stream)
        headers = msg.raw_message.headers or {}
        await ledger.on_event(
            msg.raw_message.subject, msg.body, msg_id=headers.get(MSG_ID_HEADER), seq=seq
        )

    return router
