"""``EventLog`` over the ``SANDBOX_EVT`` stream: one short-lived, in-memory, ack-less consumer
per read, filtered by subject and started at a time or a sequence, drained in batches.

Its name is ``<service>-q<random>`` and it is created with the name in the subject, which the
NATS permissions allow for any name but the services' own durables (``shared/bus/permissions``);
it deletes itself after ``_IDLE`` seconds if a reader dies before deleting it.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Sequence
from datetime import datetime

from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext

from shared.bus.middleware import MSG_ID_HEADER
from shared.bus.topology import STREAM_EVT
from shared.ports.events import StoredEvent

_BATCH = 256
_IDLE = 30.0
_FETCH_WAIT = 2.0


class NatsEventLog:
    def __init__(self, js: JetStreamContext, *, service: str, stream: str = STREAM_EVT) -> None:
        self._js = js
        self._service = service
        self._stream = stream

    async def read(
        self,
        subjects: Sequence[str],
        *,
        since: datetime | None = None,
        after_seq: int = 0,
        limit: int,
    ) -> list[StoredEvent]:
        if not subjects or limit <= 0:
            return []
        name = f"{self._service}-q{secrets.token_hex(8)}"
        config = ConsumerConfig(
            name=name,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=_IDLE,
            mem_storage=True,
            num_replicas=1,
            filter_subjects=list(subjects),
            deliver_policy=DeliverPolicy.ALL,
        )
        if after_seq > 0:
            config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = after_seq + 1
        elif since is not None:
            config.deliver_policy = DeliverPolicy.BY_START_TIME
            config.opt_start_time = since
        info = await self._js.add_consumer(self._stream, config)
        try:
            return await self._drain(name, int(info.num_pending or 0), limit)
        finally:
            with contextlib.suppress(Exception):
                await self._js.delete_consumer(self._stream, name)

    async def _drain(self, name: str, pending: int, limit: int) -> list[StoredEvent]:
        out: list[StoredEvent] = []
        if pending == 0:
            return out
        sub = await self._js.pull_subscribe_bind(consumer=name, stream=self._stream)
        try:
            while len(out) < limit and pending > 0:
                try:
                    batch = await sub.fetch(min(_BATCH, limit - len(out)), timeout=_FETCH_WAIT)
                except NatsTimeout:
                    break
                for msg in batch:
                    md = msg.metadata
                    out.append(
                        StoredEvent(
                            seq=int(md.sequence.stream),
                            subject=msg.subject,
                            data=msg.data,
                            msg_id=(msg.headers or {}).get(MSG_ID_HEADER),
                            stored_at=md.timestamp,
                        )
                    )
                    pending = int(md.num_pending)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return out
