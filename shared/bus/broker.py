"""Building and connecting the FastStream broker every service uses (docs/bus.md, "Workers")."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import nats.errors
import structlog
from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker, NatsRouter, PullSub
from faststream.nats.security import NatsUserPassword
from nats.aio.client import Client
from nats.js.errors import ServiceUnavailableError
from nats.js.kv import KeyValue
from pydantic import BaseModel

from shared.bus import subjects
from shared.bus.middleware import LogContextMiddleware, RetryDlqMiddleware
from shared.bus.topology import Durable, ensure_topology
from shared.errors import ConfigError
from shared.settings import BusSettings

log = structlog.get_logger()
T = TypeVar("T")


def connect_options(settings: BusSettings) -> dict[str, Any]:
    """Credentials for ``nats.connect`` (every raw connection: events feed, local runtime,
    provisioning)."""
    if settings.nats_creds is not None:
        return {"user_credentials": str(settings.nats_creds)}
    if settings.nats_user is not None and settings.nats_password is not None:
        return {"user": settings.nats_user, "password": settings.nats_password.get_secret_value()}
    return {}


def redact_url(url: str) -> str:
    """``nats://api:secret@host:4222`` -> ``nats://***@host:4222`` (for logs and errors)."""
    return re.sub(r"//[^@/]*@", "//***@", url)


def make_broker(settings: BusSettings, *, service: str, **kwargs: Any) -> NatsBroker:
    """NACK_ON_ERROR + our middlewares (REJECT_ON_ERROR would TERM on the first exception);
    reconnect forever (nats-py gives up after ~2 min by default)."""
    extra: dict[str, Any] = {}
    if settings.nats_creds is not None:
        extra["user_credentials"] = str(settings.nats_creds)
    elif settings.nats_user is not None and settings.nats_password is not None:
        extra["security"] = NatsUserPassword(
            settings.nats_user, settings.nats_password.get_secret_value()
        )
    return NatsBroker(
        settings.nats_url.split(","),
        name=f"torpor-{service}",
        # Replies land under a per-service prefix that only this service's NATS user may
        # subscribe to (deploy/nats/auth.conf), so no other user can read them.
        inbox_prefix=f"_INBOX_{service}",
        ack_policy=AckPolicy.NACK_ON_ERROR,
        middlewares=[LogContextMiddleware, RetryDlqMiddleware],
        # FastStream's own access logger prints every message ("Received", "Processed") to
        # stdout in its own colour format, past our JSON renderer and redaction. Route its lines
        # through ours, and its per-message lines at DEBUG: they cost CPU on every message.
        logger=logging.getLogger("torpor.bus"),
        log_level=logging.DEBUG,
        max_reconnect_attempts=-1,
        reconnect_time_wait=1,
        graceful_timeout=20,
        **extra,
        **kwargs,
    )


def subscriber_args(durable: Durable, *, max_workers: int = 8) -> dict[str, Any]:
    """Keyword arguments for ``broker.subscriber(...)`` binding one provisioned durable.

    The first filter is passed as the subject; the consumer itself was created (with all its
    filters) by ``ensure_topology``, and binding never changes it.
    """
    return {
        "subject": durable.filters[0],
        "stream": JStream(durable.stream, declare=False),
        "durable": durable.name,
        "pull_sub": PullSub(batch_size=1, timeout=5),
        "config": durable.config(),
        "max_workers": max_workers,
        # Durables are named <service>-<purpose>; pull replies must land under that service's
        # inbox prefix (see make_broker), FastStream would otherwise use the global _INBOX.
        "inbox_prefix": f"_INBOX_{durable.name.split('-', 1)[0]}.".encode(),
    }


# A service binds its buckets (and may converge the topology) as it starts, when the bus may be
# restarting (a NATS restart, a rolling upgrade): a call that gets no answer is asked again for a
# while, rather than the service exiting (CI: the API's start-up failed on one 5 s timeout during
# a NATS restart).
ANSWER_WITHIN = 60.0
# no answer (the bus away, or a permission the user lacks: NATS answers neither), or JetStream
# still recovering (503)
_NO_ANSWER = (nats.errors.TimeoutError, nats.errors.NoRespondersError, ServiceUnavailableError)


# An event a service publishes: its subject prefix, its body's schema and what it says.
EventDoc = tuple[str, type[BaseModel], str]


def document_events(router: NatsRouter, events: Iterable[EventDoc]) -> None:
    """Put the events in the router's AsyncAPI schema; documentation only (the handlers publish
    through the Publisher port, for deterministic ids)."""
    for subject, schema, description in events:
        router.publisher(
            subjects.all_of(subject), title=subject, description=description, schema=schema
        )


def denied_by_bus(nc: Client, before: Exception | None) -> str | None:
    """The server's word to this connection since its last error was ``before``, when it was a
    missing permission (NATS sends it apart from the request, which then just times out)."""
    error = nc.last_error
    if error is None or error is before:
        return None
    text = str(error)
    return text if "permissions violation" in text.lower() else None


async def until_answered(
    what: str,
    call: Callable[[], Awaitable[T]],
    *,
    within: float = ANSWER_WITHIN,
    nc: Client | None = None,
) -> T:
    """``call()`` (idempotent), asked again while the bus does not answer, each retry logged;
    after ``within`` seconds the last error is raised. Any other error fails at once, and so
    does a missing permission of ``nc``'s user refused during the call (asking again would not
    help): one line."""
    deadline = time.monotonic() + within
    pause = 0.25
    while True:
        before = nc.last_error if nc is not None else None
        try:
            return await call()
        except _NO_ANSWER as e:
            denied = denied_by_bus(nc, before) if nc is not None else None
            if denied is not None:
                msg = (
                    f"{what}: the bus refused this service's NATS user ({denied}); its "
                    "permissions (auth.conf) do not match this version of torpor"
                )
                raise ConfigError(msg) from e
            if time.monotonic() + pause >= deadline:
                raise
            log.warning("bus_no_answer_retry", call=what, error=type(e).__name__)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 4.0)


async def prepare(broker: NatsBroker, settings: BusSettings) -> None:
    """Connect and converge the topology (idempotent; every replica of every service does it)."""
    await broker.connect()
    nc = broker.config.connection_state.connection
    warn_if_anonymous(nc, settings)
    if settings.bus_provision:
        js = broker.config.connection_state.stream
        await until_answered(
            "topology",
            lambda: ensure_topology(
                js,
                replicas=settings.bus_replicas,
                kept_files_max_bytes=settings.kept_files_max_bytes,
            ),
            nc=nc,
        )


async def key_value(broker: NatsBroker, bucket: str, *, within: float = ANSWER_WITHIN) -> KeyValue:
    """The bucket, bound (never created: ``prepare`` provisions); a missing one fails at once."""
    return await until_answered(
        f"bind {bucket}",
        lambda: broker.key_value(bucket, declare=False),
        within=within,
        nc=broker.config.connection_state.connection,
    )


def accepts_anonymous(nc: Client, settings: BusSettings) -> bool:
    """Whether the bus this client reached lets clients in without credentials: we got in
    without any, or the server says it requires none."""
    info = getattr(nc, "_server_info", None) or {}
    return not settings.authenticated or not info.get("auth_required", False)


def warn_if_anonymous(nc: Client, settings: BusSettings) -> None:
    """One line at start (no secret in it): any local process can be a superuser of such a
    bus. ``torpor up`` and ``deploy/nats`` always authenticate; test stacks may not."""
    if accepts_anonymous(nc, settings):
        log.warning(
            "bus_anonymous_access",
            detail="the NATS server accepts clients without credentials: any process that can "
            "reach it can read and forge every command, event and record",
            nats_url=redact_url(settings.nats_url),
        )
