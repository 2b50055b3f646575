"""What every lifecycle worker handler does around its work: heartbeats, one sandbox at a time
per replica, and the give-up rule.

The give-up rule keeps records consistent: a handler that keeps failing does not leave its
sandbox half-way (``pausing`` forever). After the retry policy's ``give_up_after`` deliveries, or
at once for an error that cannot heal (``SnapshotTooLarge``, ``PermanentFailure``), the
transition is failed on the record (state ``failed`` with the reason) and the message is acked.
Before that, errors are re-raised as retryable so the bus middleware NAKs them with exponential
back-off, never dead-lettered, since a dead-lettered command would leave its sandbox stuck
mid-transition (``shared.bus.retry``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import structlog
from faststream.exceptions import AckMessage, NackMessage, RejectMessage, SkipMessage

from shared.bus import subjects
from shared.bus.middleware import MSG_ID_HEADER
from shared.bus.retry import PERMANENT, PoisonMessage, Retry, RetryPolicy
from shared.domain import transitions as t
from shared.domain.record import SandboxRecord
from shared.errors import IllegalTransition, RuntimeFailure, SnapshotTooLarge
from shared.models.messages import SandboxFailed
from shared.ports.bus import Publisher, SandboxStore, emit

log = structlog.get_logger()

T = TypeVar("T")

FailFn = Callable[[str], Awaitable[None]]


class PermanentFailure(Exception):
    """Retrying cannot help (e.g. an unknown template): fail the transition now."""


def deliveries(msg: Any) -> int:
    try:
        return int(msg.raw_message.metadata.num_delivered)
    except Exception:
        return 1


def header_msg_id(msg: Any, default: str) -> str:
    """The command's ``Nats-Msg-Id`` (its idempotency key); ``default`` if a publisher set none."""
    headers = getattr(getattr(msg, "raw_message", None), "headers", None) or {}
    value = headers.get(MSG_ID_HEADER)
    return str(value) if value else default


def checked_sandbox_id(msg: Any, body_sandbox_id: str) -> str:
    """The sandbox a message is about; a subject naming another one is poison."""
    if subjects.sandbox_id_of(msg.raw_message.subject) != body_sandbox_id:
        raise PoisonMessage("subject and body name different sandboxes")
    return body_sandbox_id


@contextlib.asynccontextmanager
async def heartbeat(msg: Any, *, every: float) -> AsyncIterator[None]:
    """Tell JetStream we are still working (``+WPI``) so a long handler (waiting for a pod,
    replaying) is not redelivered to another replica while it runs (JetStream hands a message
    not acknowledged within ``ack_wait`` to another consumer)."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(every)
            with contextlib.suppress(Exception):
                await msg.in_progress()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class SandboxLocks:
    """Serialises this replica's handlers per sandbox (replicas race through CAS instead)."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, sandbox_id: str) -> AsyncIterator[None]:
        entry = self._locks.setdefault(sandbox_id, (asyncio.Lock(), [0]))
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0 and self._locks.get(sandbox_id) is entry:
                del self._locks[sandbox_id]  # keep the table to sandboxes in flight

    def __len__(self) -> int:
        return len(self._locks)


async def guarded(
    work: Callable[[], Awaitable[T]], *, msg: Any, retry: RetryPolicy, fail: FailFn
) -> T | None:
    """Run ``work``; on a persistent failure call ``fail(reason)`` and ack instead of retrying."""
    try:
        return await work()
    except (
        IllegalTransition,
        Retry,
        PoisonMessage,
        AckMessage,
        NackMessage,
        RejectMessage,
        SkipMessage,
    ):
        raise
    except (SnapshotTooLarge, PermanentFailure) as e:
        await _fail(fail, str(e))
        return None
    except Exception as e:
        n = deliveries(msg)
        if retry.gives_up(n):
            log.error("transition_gave_up", error=repr(e), deliveries=n)
            await _fail(fail, f"{type(e).__name__}: {e}")
            return None
        if isinstance(e, PERMANENT):
            # The middleware dead-letters these (bad input); this one came from the work, not
            # from the message, so it must be retried like any other failure.
            raise RuntimeFailure(repr(e)) from e
        raise


async def run_guarded(
    work: Callable[[], Awaitable[T]],
    *,
    msg: Any,
    retry: RetryPolicy,
    fail: FailFn,
    lock: contextlib.AbstractAsyncContextManager[None] | None = None,
) -> T | None:
    """``guarded`` with heartbeats, optionally holding a per-sandbox lock (``SandboxLocks``)."""
    async with heartbeat(msg, every=retry.heartbeat_every), lock or contextlib.nullcontext():
        return await guarded(work, msg=msg, retry=retry, fail=fail)


async def _fail(fail: FailFn, reason: str) -> None:
    try:
        await fail(reason)
    except IllegalTransition as e:
        log.info("give_up_not_applicable", error=str(e))


async def fail_transition(
    store: SandboxStore,
    publisher: Publisher,
    op: t.Op,
    sandbox_id: str,
    reason: str,
    *,
    cmd_msg_id: str | None = None,
    generation: int | None = None,
) -> SandboxRecord:
    """Give up ``op``: the record says ``failed`` with the reason, and ``sandbox.evt.failed``
    tells everyone else (the api's waiter answers with it). ``IllegalTransition`` when the
    record has moved on (``_fail`` logs that)."""
    record = await store.update(
        sandbox_id, t.failed(op, reason, cmd_msg_id=cmd_msg_id, generation=generation)
    )
    await emit(
        publisher,
        SandboxFailed(
            sandbox_id=sandbox_id, generation=record.generation, at=t.now(), op=op, reason=reason
        ),
    )
    return record
