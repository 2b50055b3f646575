"""Publishing commands and events with deterministic message ids and correlation headers."""

from __future__ import annotations

from typing import Any

import structlog
from pydantic import BaseModel

from shared.bus import subjects, topology
from shared.bus.middleware import CAUSATION_HEADER, CORRELATION_HEADER, MSG_ID_HEADER
from shared.errors import Unavailable


class BrokerPublisher:
    """Adapter over a connected FastStream ``NatsBroker``; waits for the JetStream PubAck."""

    def __init__(self, broker: Any, *, timeout: float = 5.0) -> None:
        self._broker = broker
        self._timeout = timeout

    async def publish(self, message: BaseModel, subject: str, *, msg_id: str) -> bool:
        ctx = structlog.contextvars.get_contextvars()
        headers = {MSG_ID_HEADER: msg_id}
        if causation := ctx.get("causation_id"):
            headers[CAUSATION_HEADER] = str(causation)
        correlation = ctx.get("correlation_id")
        if correlation:
            headers[CORRELATION_HEADER] = str(correlation)
        try:
            ack = await self._broker.publish(
                message.model_dump(mode="json"),
                subject,
                stream=_stream_for(subject),
                headers=headers,
                correlation_id=str(correlation) if correlation else None,
                timeout=self._timeout,
            )
        except Exception as e:
            msg = f"could not publish {subject}: {e!r}"
            raise Unavailable(msg) from e
        return not bool(getattr(ack, "duplicate", False))


def _stream_for(subject: str) -> str:
    if subject.startswith("sandbox.cmd."):
        return topology.STREAM_CMD
    if subject.startswith("sandbox.evt."):
        return topology.STREAM_EVT
    if subject.startswith(("sandbox.sched.", "sandbox.timer.")):
        return topology.STREAM_TIMERS
    if subject.startswith(subjects.WEBHOOK_DELIVERY + "."):
        return topology.STREAM_WEBHOOKS
    return topology.STREAM_DLQ
