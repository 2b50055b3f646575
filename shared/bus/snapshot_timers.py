"""A stored snapshot's retention as a NATS message schedule (like the scheduler's timers).

The holder ``sandbox.sched.snapshot_retention.<snapshot id>`` carries ``Nats-Schedule: @at
<retain_until>``; at that time the server publishes its body (a ``DeleteSnapshot`` with reason
``retention``) to ``sandbox.timer.snapshot_expired.<source sandbox id>``, which the snapshotter's
durable ``snapshotter-expiry`` consumes. Durable across restarts of NATS and of every service.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from nats.errors import Error as NatsError
from nats.js.api import Header
from nats.js.client import JetStreamContext

from shared.bus import subjects
from shared.bus.middleware import MSG_ID_HEADER
from shared.bus.topology import STREAM_TIMERS
from shared.errors import Unavailable
from shared.models.messages import DeleteSnapshot


class NatsSnapshotTimers:
    def __init__(
        self, js: Callable[[], JetStreamContext], *, fired_ttl: str = "1h", timeout: float = 5.0
    ) -> None:
        self._js = js  # resolved at first use: the broker connects after the router is built
        self._fired_ttl = fired_ttl
        self._timeout = timeout

    async def arm(self, sandbox_id: str, snapshot_id: str, due: datetime) -> None:
        body = DeleteSnapshot(sandbox_id=sandbox_id, snapshot_id=snapshot_id, reason="retention")
        headers = {
            Header.SCHEDULE: f"@at {due.isoformat()}",
            Header.SCHEDULE_TARGET: subjects.of(subjects.TIMER_SNAPSHOT_EXPIRED, sandbox_id),
            Header.SCHEDULE_TTL: self._fired_ttl,
            MSG_ID_HEADER: f"snapshot_retention:{snapshot_id}",
        }
        try:
            await self._js().publish(
                subjects.of(subjects.SCHED_SNAPSHOT_RETENTION, snapshot_id),
                body.model_dump_json().encode(),
                stream=STREAM_TIMERS,
                headers=headers,
                timeout=self._timeout,
            )
        except (NatsError, TimeoutError) as e:
            msg = f"could not arm the retention of snapshot {snapshot_id}: {e!r}"
            raise Unavailable(msg) from e
