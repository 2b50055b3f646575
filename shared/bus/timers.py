"""NATS message schedules (server 2.12+; NATS ADR-51,
https://github.com/nats-io/nats-architecture-and-design/blob/main/adr/ADR-51.md) as durable
timers: the adapter.

A timer is a *holder* message on ``sandbox.sched.<holder>.<sid>`` with ``Nats-Schedule: @at
<RFC3339 UTC>`` and ``Nats-Schedule-Target: sandbox.timer.fired.<sid>``. The server keeps it
(file storage, survives restarts of NATS and of every scheduler), publishes the body to the target
at the due time, then removes the holder. One pending schedule per subject: publishing the holder
again replaces it, purging the subject cancels it. The scheduler process holds no timers itself.
"""

from __future__ import annotations

import contextlib
from datetime import datetime

from nats.errors import Error as NatsError
from nats.js.api import Header
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from shared.bus.middleware import MSG_ID_HEADER
from shared.bus.schedules import Holder, Timer, fired_subject, holder_subject
from shared.bus.topology import STREAM_TIMERS
from shared.errors import Unavailable


async def publish_schedule(
    js: JetStreamContext,
    *,
    holder: str,
    target: str,
    due: datetime,
    body: bytes,
    msg_id: str,
    fired_ttl: str,
    timeout: float,
    what: str,
) -> None:
    """Store (or replace) the one schedule on ``holder``: at ``due`` the server publishes
    ``body`` to ``target``; ``what`` names it in the error."""
    headers = {
        Header.SCHEDULE: f"@at {due.isoformat()}",
        Header.SCHEDULE_TARGET: target,
        # The fired copy expires by itself (needs allow_msg_ttl on the stream).
        Header.SCHEDULE_TTL: fired_ttl,
        MSG_ID_HEADER: msg_id,
    }
    try:
        await js.publish(holder, body, stream=STREAM_TIMERS, headers=headers, timeout=timeout)
    except (NatsError, TimeoutError) as e:
        msg = f"could not arm {what}: {e!r}"
        raise Unavailable(msg) from e


class NatsTimers:
    def __init__(
        self, js: JetStreamContext, *, fired_ttl: str = "1h", timeout: float = 5.0
    ) -> None:
        self._js = js
        self._fired_ttl = fired_ttl
        self._timeout = timeout

    async def arm(self, timer: Timer) -> None:
        """Store (or replace) the sandbox's schedule for this holder; idempotent per timer."""
        await publish_schedule(
            self._js,
            holder=timer.holder_subject(),
            target=fired_subject(timer.sandbox_id),
            due=timer.due,
            body=timer.model_dump_json().encode(),
            msg_id=timer.msg_id(),
            fired_ttl=self._fired_ttl,
            timeout=self._timeout,
            what=f"{timer.kind} timer for {timer.sandbox_id}",
        )

    async def cancel(self, sandbox_id: str, holder: Holder) -> None:
        try:
            await self._js.purge_stream(STREAM_TIMERS, subject=holder_subject(holder, sandbox_id))
        except (NatsError, TimeoutError) as e:
            msg = f"could not cancel {holder} timer for {sandbox_id}: {e!r}"
            raise Unavailable(msg) from e

    async def pending(self, sandbox_id: str, holder: Holder) -> Timer | None:
        """The schedule waiting on this holder, if any (fired holders are removed by the server)."""
        try:
            raw = await self._js.get_last_msg(STREAM_TIMERS, holder_subject(holder, sandbox_id))
        except NotFoundError:
            return None
        except (NatsError, TimeoutError) as e:
            msg = f"could not read {holder} timer for {sandbox_id}: {e!r}"
            raise Unavailable(msg) from e
        if not raw.data:
            return None
        with contextlib.suppress(ValueError):
            return Timer.model_validate_json(raw.data)
        return None
