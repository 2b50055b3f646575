"""NATS message schedules (server 2.12+; NATS ADR-51,
https://github.com/nats-io/nats-architecture-and-design/blob/main/adr/ADR-51.md) as durable
timers: the adapter.

A timer is a *holder* message on ``sandbox.sched.<holder>.<sid>`` with ``Nats-Schedule: @at
<RFC3339 UTC>`` and ``Nats-Schedule-Target: sandbox.timer.fired.<sid>``. The server keeps it
(file storage, survives restarts of NATS and of every scheduler), publishes the body to the target
at the due time, then removes the holder. One pending schedule per subject: publishing the holder
again replaces it, purging the subject cancels it. The scheduler process holds no timers itself.

Arming goes out in **atomic batches** (NATS ADR-50, stream ``allow_atomic``): the arms that
concurrent handlers make while the previous batch is being stored are committed together, up to
1000 at a time. With ``sync_interval: always`` every stored message costs an fsync; a batch costs
about one (measured: 20,000 schedules in 1.2 s batched against 8.1 s one by one). The server
refuses a whole batch for one bad message (and for a message id it has already seen: an arm
repeated after a redelivery), so a refused batch is published again one schedule at a time and
each arm gets its own outcome.

A schedule is never set further ahead than ``MAX_AHEAD`` (7 days): nats-server fires a schedule
whose time is centuries away at once (an overflowing duration, observed with year 9999). The
record stays the truth: a timer that fires before the deadline re-arms (``expiry``: ``moved``).

**Lead.** nats-server fires a schedule late: its schedule timer runs at most every 250 ms
(``server/scheduler.go``, ``resetTimer``) and each fire is an fsynced store, so a fire lands
0-0.5 s after its time (measured: p50 0.19 s, p99 0.40 s at 150 fires/s on an idle server). The
adapter therefore sets the schedule ``lead`` before the timer's ``due`` (the body keeps ``due``,
so the message id and what ``pending`` reads are unchanged), and the scheduler holds an early
fire until its ``due`` (``services.scheduler.expiry.hold_for``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from datetime import UTC, datetime, timedelta

from nats.errors import Error as NatsError
from nats.js.api import Header
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from shared.bus.middleware import MSG_ID_HEADER
from shared.bus.schedules import Holder, Timer, fired_subject, holder_subject
from shared.bus.topology import STREAM_TIMERS
from shared.errors import Unavailable

MAX_AHEAD = timedelta(days=7)
_MAX_BATCH = 1000  # nats-server's limit on the messages of one atomic batch


def schedule_headers(*, target: str, due: datetime, msg_id: str, fired_ttl: str) -> dict[str, str]:
    return {
        Header.SCHEDULE: f"@at {due.isoformat()}",
        Header.SCHEDULE_TARGET: target,
        # The fired copy expires by itself (needs allow_msg_ttl on the stream).
        Header.SCHEDULE_TTL: fired_ttl,
        MSG_ID_HEADER: msg_id,
    }


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
    headers = schedule_headers(target=target, due=due, msg_id=msg_id, fired_ttl=fired_ttl)
    try:
        await js.publish(holder, body, stream=STREAM_TIMERS, headers=headers, timeout=timeout)
    except (NatsError, TimeoutError) as e:
        msg = f"could not arm {what}: {e!r}"
        raise Unavailable(msg) from e


def _capped(due: datetime) -> datetime:
    """For the scheduler's timers only: one that fires before the record's time re-arms (a
    stored snapshot's retention timer deletes when it fires, so it is not capped)."""
    return min(due, datetime.now(UTC) + MAX_AHEAD)


class NatsTimers:
    def __init__(
        self,
        js: JetStreamContext,
        *,
        fired_ttl: str = "1h",
        timeout: float = 5.0,
        batched: bool = True,
        lead: timedelta = timedelta(0),
    ) -> None:
        self._js = js
        self._lead = lead
        self._fired_ttl = fired_ttl
        self._timeout = timeout
        self._batched = batched
        self._queue: list[tuple[Timer, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def arm(self, timer: Timer) -> None:
        """Store (or replace) the sandbox's schedule for this holder; idempotent per timer.
        Returns once the server has stored it (in a batch with other handlers' arms)."""
        if not self._batched:
            await self._arm_one(timer)
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((timer, done))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="timers-flush")
        await done

    def _fires_at(self, timer: Timer) -> datetime:
        """When the server is asked to fire it: ``lead`` early (it fires late, see above)."""
        return _capped(timer.due) - self._lead

    async def _arm_one(self, timer: Timer) -> None:
        await publish_schedule(
            self._js,
            holder=timer.holder_subject(),
            target=fired_subject(timer.sandbox_id),
            due=self._fires_at(timer),
            body=timer.model_dump_json().encode(),
            msg_id=timer.msg_id(),
            fired_ttl=self._fired_ttl,
            timeout=self._timeout,
            what=f"{timer.kind} timer for {timer.sandbox_id}",
        )

    async def _flush(self) -> None:
        """One batch in flight; whatever queues up meanwhile is the next batch."""
        await asyncio.sleep(0)  # the arms of handlers resumed in this same loop pass
        while self._queue:
            chunk, self._queue = self._queue[:_MAX_BATCH], self._queue[_MAX_BATCH:]
            try:
                await self._commit(chunk)
            except BaseException as e:  # cancelled (shutting down): nobody waits forever
                for _, done in chunk:
                    if not done.done():
                        done.set_exception(Unavailable(f"arming interrupted: {e!r}"))
                raise

    async def _commit(self, chunk: list[tuple[Timer, asyncio.Future[None]]]) -> None:
        # One message per holder subject in a batch (the server refuses a second one): the
        # arm queued last wins, as it would have by publishing last.
        last = {timer.holder_subject(): timer for timer, _ in chunk}
        timers = list(last.values())
        failed: dict[str, BaseException] = {}
        try:
            if len(timers) == 1:
                await self._arm_one(timers[0])
            else:
                await self._publish_batch(timers)
        except Unavailable:
            results = await asyncio.gather(
                *(self._arm_one(t) for t in timers), return_exceptions=True
            )
            failed = {
                t.holder_subject(): r
                for t, r in zip(timers, results, strict=True)
                if isinstance(r, BaseException)
            }
        for timer, done in chunk:
            if done.done():  # its handler was cancelled
                continue
            error = failed.get(timer.holder_subject())
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

    async def _publish_batch(self, timers: list[Timer]) -> None:
        nc = self._js._nc
        batch = uuid.uuid4().hex
        last = len(timers) - 1
        try:
            for i, timer in enumerate(timers):
                headers = {
                    **schedule_headers(
                        target=fired_subject(timer.sandbox_id),
                        due=self._fires_at(timer),
                        msg_id=timer.msg_id(),
                        fired_ttl=self._fired_ttl,
                    ),
                    "Nats-Expected-Stream": STREAM_TIMERS,
                    "Nats-Batch-Id": batch,
                    "Nats-Batch-Sequence": str(i + 1),
                }
                subject, body = timer.holder_subject(), timer.model_dump_json().encode()
                if i < last:
                    await nc.publish(subject, body, headers=headers)
                    continue
                headers["Nats-Batch-Commit"] = "1"
                reply = await nc.request(
                    subject, body, headers=headers, timeout=max(self._timeout, 10.0)
                )
        except (NatsError, TimeoutError) as e:
            msg = f"could not arm a batch of {len(timers)} timers: {e!r}"
            raise Unavailable(msg) from e
        answer = json.loads(reply.data or b"{}")
        if "error" in answer:
            msg = f"a batch of {len(timers)} timers was refused: {answer['error']}"
            raise Unavailable(msg)

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
