"""FastStream middlewares every torpor worker installs (docs/bus.md, "Failures" and "Workers").

- ``LogContextMiddleware`` binds correlation id, causation id, subject, sandbox id and delivery
  count into structlog's contextvars for the duration of one message, so every log line and every
  publish made while handling it carries them.
- ``RetryDlqMiddleware`` turns exceptions into acknowledgements by the durable's retry policy
  (``shared.bus.retry``): permanent → dead-letter copy + TERM; ``Retry``/transient → NAK with
  exponential delay; after ``dead_letter_after`` deliveries → dead-letter + TERM.
"""

from __future__ import annotations

from typing import Any, Literal

import structlog
from faststream import BaseMiddleware
from faststream.exceptions import AckMessage, NackMessage, RejectMessage, SkipMessage

from shared.bus import subjects
from shared.bus.retry import Retry
from shared.bus.topology import STREAM_DLQ, retry_policy_of
from shared.errors import IllegalTransition
from shared.redaction import redact_json_bytes, redact_text, redact_value

log = structlog.get_logger()

CORRELATION_HEADER = "correlation_id"
CAUSATION_HEADER = "causation_id"
MSG_ID_HEADER = "Nats-Msg-Id"


def _headers(msg: Any) -> dict[str, str]:
    raw = getattr(msg, "raw_message", None)
    return dict(getattr(raw, "headers", None) or {})


def _num_delivered(msg: Any) -> int:
    raw = getattr(msg, "raw_message", None)
    try:
        return int(raw.metadata.num_delivered)  # type: ignore[union-attr]
    except Exception:
        return 1


class LogContextMiddleware(BaseMiddleware):
    async def consume_scope(self, call_next: Any, msg: Any) -> Any:
        headers = _headers(msg)
        raw = getattr(msg, "raw_message", None)
        subject = str(getattr(raw, "subject", "") or "")
        bound = {
            "correlation_id": headers.get(CORRELATION_HEADER)
            or getattr(msg, "correlation_id", None),
            "causation_id": headers.get(MSG_ID_HEADER),
            "subject": subject,
            "sandbox_id": subjects.sandbox_id_of(subject) if subject else None,
            "delivery": _num_delivered(msg),
        }
        with structlog.contextvars.bound_contextvars(**bound):
            return await call_next(msg)


def _consumer(msg: Any) -> str | None:
    try:
        return str(msg.raw_message.metadata.consumer)
    except Exception:
        return None


Disposition = tuple[Literal["ack", "nak", "dead_letter"], float]


def disposition(error: Exception, deliveries: int, consumer: str | None) -> Disposition:
    """What a failed delivery turns into (logged here): the one rule for FastStream's middleware
    and the batch consumer (``shared.bus.batches``)."""
    if isinstance(error, IllegalTransition):
        # Redelivery or a race already settled by another replica: nothing left to do.
        log.info("transition_not_applicable", error=str(error))
        return "ack", 0.0
    if isinstance(error, Retry):
        log.info("retry_later", reason=str(error), delay=error.delay)
        return "nak", error.delay
    action, delay = retry_policy_of(consumer).on_error(error, deliveries)
    if action == "dead_letter":
        log.error("giving_up", error=redact_text(repr(error)), deliveries=deliveries)
        return "dead_letter", 0.0
    log.warning(
        "handler_failed_will_retry",
        error=redact_text(repr(error)),
        deliveries=deliveries,
        delay=delay,
    )
    return "nak", delay


class RetryDlqMiddleware(BaseMiddleware):
    async def consume_scope(self, call_next: Any, msg: Any) -> Any:
        try:
            return await call_next(msg)
        except (AckMessage, NackMessage, RejectMessage, SkipMessage):
            raise
        except Exception as e:
            action, delay = disposition(e, _num_delivered(msg), _consumer(msg))
            if action == "ack":
                raise AckMessage from e
            if action == "dead_letter":
                await dead_letter(msg, e)
                raise RejectMessage from e
            raise NackMessage(delay=delay) from e


async def dead_letter(msg: Any, exc: BaseException) -> None:
    """Copy the original message, its headers and the error into the DLQ stream (then caller TERMs;
    in a work-queue stream a TERM deletes the original)."""
    await dead_letter_raw(msg.raw_message, exc, _num_delivered(msg))


async def dead_letter_raw(raw: Any, exc: BaseException, deliveries: int) -> None:
    """``dead_letter`` for a nats-py message."""
    md = getattr(raw, "metadata", None)
    consumer = getattr(md, "consumer", None) or "core"
    seq = getattr(getattr(md, "sequence", None), "stream", 0)
    stream = getattr(md, "stream", None) or "core"
    sid = subjects.sandbox_id_of(raw.subject) or "unknown"
    # Masked copies (shared/redaction.py): a malformed message may quote a secret, and the error
    # (a pydantic ValidationError) quotes the input.
    headers = {
        **{k: redact_value(k, v) for k, v in (raw.headers or {}).items()},
        "x-error": redact_text(repr(exc).replace("\n", " "))[:1024],
        "x-src-subject": raw.subject,
        "x-src-stream": str(stream),
        "x-src-seq": str(seq),
        "x-deliveries": str(deliveries),
        MSG_ID_HEADER: f"dlq:{stream}:{seq}:{consumer}",
    }
    js = raw._client.jetstream()
    await js.publish(
        f"{subjects.DLQ_PREFIX}.{consumer}.{sid}",
        redact_json_bytes(raw.data),
        stream=STREAM_DLQ,
        headers=headers,
    )
    log.error("dead_lettered", error=headers["x-error"], src_subject=raw.subject)
