"""The sandbox proxy as a plain ASGI app: route, authorise, wake (auto-resume), forward.

Errors are JSON ``{"code": <int>, "message": "..."}``; the SDK maps a 502 whose message says
"was not found" to ``SandboxNotRunningException`` and "port is not open" to
``SandboxUnreachableException`` (``e2b/envd/rpc.py``).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime

import structlog
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from starlette.types import Receive, Scope, Send

from services.proxy import access
from services.proxy.access import RefusedError
from services.proxy.activity import ActivityThrottle, is_activity
from services.proxy.forwarding import (
    RequestBody,
    UpstreamFailedError,
    UpstreamUnreachableError,
    forward_http,
    forward_websocket,
)
from services.proxy.ports import ProxyWiring
from services.proxy.routing import BadTargetError, Target, target_of, upstream_host
from services.proxy.settings import ProxySettings
from services.proxy.slots import ExchangeSlots
from services.proxy.upstream import UpstreamPool
from services.proxy.waking import NotRunningError, Waker
from shared.domain import states
from shared.domain.record import SandboxRecord
from shared.errors import QuotaExceeded
from shared.web.limits import HttpLimits
from shared.web.requests import BodyReader, InFlight, RequestRefused, check_declared

log = structlog.get_logger()


_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def correlation_id_from(headers: list[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name.lower() in (b"x-correlation-id", b"x-request-id"):
            candidate = value.decode("latin-1")
            if _SAFE_ID.match(candidate):
                return candidate
    return uuid.uuid4().hex


def _booting_until(record: SandboxRecord, grace: float) -> float:
    """Monotonic deadline for retrying refused connections: ``grace`` after the pod started."""
    age = (datetime.now(UTC) - record.started_at).total_seconds()
    return time.monotonic() + max(0.0, grace - age)


class ProxyApp:
    def __init__(
        self,
        settings: ProxySettings,
        *,
        wiring: ProxyWiring | None = None,
        connect: Callable[[], AbstractAsyncContextManager[ProxyWiring]] | None = None,
        registry: CollectorRegistry | None = None,
        limits: HttpLimits | None = None,
    ) -> None:
        self.settings = settings
        self.limits = limits if limits is not None else HttpLimits()
        self.in_flight = InFlight(self.limits.max_requests_per_client)
        self._slots: dict[tuple[str, int], ExchangeSlots] = {}
        self.registry = registry or CollectorRegistry()
        self._connect = connect
        self._wiring: ProxyWiring | None = None
        self._pool: UpstreamPool | None = None
        self.waker: Waker | None = None
        self.activity: ActivityThrottle | None = None
        self._requests = Counter(
            "torpor_proxy_requests_total",
            "Proxied requests by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self._ttfb = Histogram(
            "torpor_proxy_upstream_seconds",
            "Time until the sandbox answered (response headers), wake-up included",
            registry=self.registry,
        )
        self._proxied = self._requests.labels("proxied")
        self.fast_exchanges = Counter(
            "torpor_proxy_fast_path",
            "Proxied HTTP exchanges served without the ASGI app (services.proxy.relay, "
            "services.proxy.fastpath)",
            registry=self.registry,
        )
        self.handovers = Counter(
            "torpor_proxy_handovers",
            "Client connections the relay handed to the ASGI server (services.proxy.relay)",
            registry=self.registry,
        )
        if wiring is not None:
            self.attach(wiring)

    def attach(self, wiring: ProxyWiring) -> None:
        self._wiring = wiring
        self.waker = Waker(
            wiring.lifecycle,
            wait=self.settings.resume_wait,
            registry=self.registry,
            admit=wiring.admit_resume,
        )
        self.activity = ActivityThrottle(wiring.lifecycle, interval=self.settings.touch_interval)

    @property
    def wiring(self) -> ProxyWiring | None:
        return self._wiring

    def http_protocol(self, limits: HttpLimits) -> type[asyncio.Protocol]:
        """The connection protocol to serve this app with: ordinary proxied exchanges relayed
        from callbacks (``services.proxy.relay``), everything else handed to the guarded
        protocol plus the fast path (``services.proxy.fastpath``)."""
        from services.proxy.relay import relay_protocol

        return relay_protocol(self, limits)

    def count_refusal(self, status: int) -> None:
        self._requests.labels(f"refused_{status}").inc()

    def observe_proxied(self, seconds: float, *, fast: bool = False) -> None:
        self._proxied.inc()
        self._ttfb.observe(seconds)
        if fast:
            self.fast_exchanges.inc()

    def upstream_pool(self) -> UpstreamPool:
        if self._pool is None:
            self._pool = UpstreamPool(connect_timeout=self.settings.connect_timeout)
        return self._pool

    async def aclose(self) -> None:
        if self.activity is not None:
            await self.activity.drain()
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    # ---- ASGI -------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        cid = correlation_id_from(scope.get("headers", []))
        with structlog.contextvars.bound_contextvars(correlation_id=cid):
            try:
                target = target_of(scope.get("headers", []))
            except BadTargetError as e:
                await self._refuse(scope, send, 400, str(e))
                return
            if target is None:
                await self._own(scope, send)
                return
            with structlog.contextvars.bound_contextvars(sandbox_id=target.sandbox_id):
                try:
                    client = self.in_flight.acquire(scope)
                except RequestRefused as e:
                    await self._refuse(scope, send, e.status, e.message, e.retry_after)
                    return
                try:
                    await self._proxy(scope, receive, send, target)
                finally:
                    self.in_flight.release(client)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        stack: AbstractAsyncContextManager[ProxyWiring] | None = None
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    if self._connect is not None and self._wiring is None:
                        stack = self._connect()
                        self.attach(await stack.__aenter__())
                except Exception as e:
                    await send({"type": "lifespan.startup.failed", "message": repr(e)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                if stack is not None:
                    await stack.__aexit__(None, None, None)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _own(self, scope: Scope, send: Send) -> None:
        """Requests that name no sandbox: the proxy's own health and metrics."""
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})
            return
        path = scope["path"]
        if path in ("/health", "/healthz", "/livez", "/readyz"):
            ready = self._wiring is not None
            await _plain(send, 200 if ready else 503, b"ok\n" if ready else b"starting\n")
        elif path == "/metrics":
            await _plain(send, 200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        else:
            await self._refuse(
                scope,
                send,
                400,
                "no sandbox named: send E2b-Sandbox-Id (and E2b-Sandbox-Port) or use the host "
                "{port}-{sandboxID}.{domain}",
            )

    async def _refuse(
        self, scope: Scope, send: Send, status: int, message: str, retry_after: int | None = None
    ) -> None:
        self.count_refusal(status)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008 if status < 500 else 1011})
            return
        body = json.dumps({"code": status, "message": message}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        if retry_after is not None:
            headers.append((b"retry-after", str(retry_after).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    # ---- the hot path ----------------------------------------------------------------------

    async def _proxy(self, scope: Scope, receive: Receive, send: Send, target: Target) -> None:
        wiring = self._wiring
        if wiring is None or self.waker is None or self.activity is None:
            await self._refuse(scope, send, 503, "the proxy is starting")
            return
        started = time.perf_counter()
        try:
            record = await wiring.records.get(target.sandbox_id)
            if record is None or states.is_gone(record.state):
                raise RefusedError(502, f"The sandbox {target.sandbox_id} was not found")
            known = await self._authorise(scope, target, record, wiring)
            if scope["type"] == "http":
                check_declared(scope, self.settings.max_body_bytes)  # 413 before waking
            if self.waker.needs_waking(record):
                # A signed URL is unverified here (only the daemon can check it): no wake.
                unverified = record.envd_access_token and access.signed_files_request(scope)
                if not known and (unverified or not self.settings.anonymous_wake):
                    raise NotRunningError(
                        f"The sandbox {target.sandbox_id} was not found: it is "
                        f"{record.state.value} (anonymous requests do not resume sandboxes)"
                    )
                record = await self.waker.running(record)
                wiring.records.remember(record)
        except (RefusedError, RequestRefused) as e:
            await self._refuse(scope, send, e.status, e.message)
            return
        except NotRunningError as e:
            await self._refuse(scope, send, 502, str(e))
            return
        except QuotaExceeded as e:  # the owner's running quota or resume rate
            await self._refuse(scope, send, 429, str(e), e.retry_after)
            return
        except TimeoutError:
            await self._refuse(scope, send, 504, f"sandbox {target.sandbox_id} is still resuming")
            return
        except Exception as e:
            log.warning("wake_failed", error=repr(e))
            await self._refuse(
                scope, send, 502, f"The sandbox {target.sandbox_id} was not found: {e}"
            )
            return
        if is_activity(target.is_daemon, scope["path"]):
            self.activity.seen(target.sandbox_id)
        host = upstream_host(record)
        # Nothing is sent upstream before a connection exists, so a refused connect can be
        # retried while a just-resumed sandbox's processes start listening again.
        grace_until = _booting_until(record, self.settings.boot_grace)
        delay = 0.05
        body = RequestBody(scope, self._body_reader(scope, receive))
        while True:
            try:
                await self._forward(scope, receive, send, target, body, host=host, started=started)
                return
            except UpstreamFailedError as e:
                await self._refuse(scope, send, 502, f"The sandbox {target.sandbox_id}: {e}")
                return
            except RequestRefused as e:  # the body was too large or too slow
                await self._refuse(scope, send, e.status, e.message)
                return
            except UpstreamUnreachableError:
                if time.monotonic() + delay > grace_until:
                    break
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        await self._refuse(
            scope,
            send,
            502,
            f"The sandbox {target.sandbox_id} is running but port is not open: nothing "
            f"listens on port {target.port}",
        )

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        target: Target,
        body: RequestBody,
        *,
        host: str,
        started: float,
    ) -> None:
        if scope["type"] == "websocket":
            self._requests.labels("websocket").inc()
            await forward_websocket(
                scope,
                receive,
                send,
                host=host,
                port=target.port,
                open_timeout=self.settings.connect_timeout,
            )
            return
        async with self.slot(host, target.port):
            status = await forward_http(
                self.upstream_pool(), scope, receive, send, body, host=host, port=target.port
            )
        self.observe_proxied(time.perf_counter() - started)
        log.debug("proxied", port=target.port, status=status)

    def _body_reader(self, scope: Scope, receive: Receive) -> Receive:
        """``receive`` bounded in size and time, for a request that has a body."""
        if scope["type"] != "http" or not _declares_body(scope):
            return receive
        return BodyReader(
            receive,
            limit=self.settings.max_body_bytes,
            idle=self.limits.body_idle_timeout,
            total=self.settings.body_timeout,
        )

    def slot(self, host: str, port: int) -> ExchangeSlots:
        """Bound concurrent exchanges per upstream (host, port); see ``max_connections``."""
        key = (host, port)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = ExchangeSlots(self.settings.max_connections)
        return slot

    async def _authorise(
        self, scope: Scope, target: Target, record: SandboxRecord, wiring: ProxyWiring
    ) -> bool:
        return await access.authorise(
            scope, target, record, wiring.keys, public_ports=self.settings.public_ports
        )

    def authorise_by_token(self, scope: Scope, target: Target, record: SandboxRecord) -> bool:
        """``access.authorise_by_token`` (no I/O: the fast path calls it directly)."""
        return access.authorise_by_token(
            scope, target, record, public_ports=self.settings.public_ports
        )


def _declares_body(scope: Scope) -> bool:
    for name, value in scope.get("headers", []):
        if name == b"transfer-encoding" or (name == b"content-length" and value not in (b"0", b"")):
            return True
    return False


async def _plain(send: Send, status: int, body: bytes, content_type: str = "text/plain") -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
