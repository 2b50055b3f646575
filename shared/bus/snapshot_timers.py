"""A stored snapshot's retention as a NATS message schedule (like the scheduler's timers).

The holder ``sandbox.sched.snapshot_retention.<snapshot id>`` carries ``Nats-Schedule: @at
<retain_until>``; at that time the server publishes its body (a ``DeleteSnapshot`` with reason
``retention``) to ``sandbox.timer.snapshot_expired.<source sandbox id>``, which the snapshotter's
durable ``snapshotter-expiry`` consumes. Durable across restarts of NATS and of every service.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from nats.js.client import JetStreamContext

from shared.bus import subjects
from shared.bus.timers import publish_schedule
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
        await publish_schedule(
            self._js(),
            holder=subjects.of(subjects.SCHED_SNAPSHOT_RETENTION, snapshot_id),
            target=subjects.of(subjects.TIMER_SNAPSHOT_EXPIRED, sandbox_id),
            due=due,
            body=body.model_dump_json().encode(),
            msg_id=f"snapshot_retention:{snapshot_id}",
            fired_ttl=self._fired_ttl,
            timeout=self._timeout,
            what=f"the retention of snapshot {snapshot_id}",
        )
