"""Helpers every lifecycle worker handler uses: heartbeats, delivery counts, the give-up rule.

The give-up rule keeps records consistent: a handler that keeps failing does not leave its
sandbox half-way (``pausing`` forever). After ``give_up_after`` deliveries, or at once for an
error that cannot heal (``SnapshotTooLarge``), the transition is failed on the record (state
``failed`` with the reason) and the message is acked. Before that, errors are re-raised as
retryable so the bus middleware NAKs them with exponential back-off — never dead-lettered, since
a dead-lettered command would leave its sandbox stuck mid-transition.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import structlog
from faststream.exceptions import AckMessage, NackMessage, RejectMessage, SkipMessage

from shared.bus.middleware import MSG_ID_HEADER, PoisonMessage, Retry
from shared.errors import IllegalTransition, RuntimeFailure, SnapshotTooLarge

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


@contextlib.asynccontextmanager
async def heartbeat(msg: Any, *, every: float) -> AsyncIterator[None]:
    """Tell JetStream we are still working (``+WPI``) so a long handler (waiting for a pod,
    replaying) is not redelivered to another replica while it runs (bus design pitfall 8)."""

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


async def guarded(
    work: Callable[[], Awaitable[T]], *, msg: Any, give_up_after: int, fail: FailFn
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
        if n >= give_up_after:
            log.error("transition_gave_up", error=repr(e), deliveries=n)
            await _fail(fail, f"{type(e).__name__}: {e}")
            return None
        if isinstance(e, ValueError):
            # The middleware dead-letters ValueErrors (poison input); this one came from the work,
            # not from the message, so it must be retried like any other failure.
            raise RuntimeFailure(repr(e)) from e
        raise


async def _fail(fail: FailFn, reason: str) -> None:
    try:
        await fail(reason)
    except IllegalTransition as e:
        log.info("give_up_not_applicable", error=str(e))
