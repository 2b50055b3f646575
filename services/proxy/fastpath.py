"""The proxy's fast path: a proxied HTTP exchange without the ASGI layers.

Why: under uvicorn + ASGI a proxied request cost the proxy more CPU than the daemon spends
answering it (scope and message dicts, response header re-validation, a structlog context per
request, a correlation id from ``uuid4``, the record lookup as a coroutine), so the proxy
reached only 0.7-0.8 of direct throughput. Here the connection protocol (uvicorn's httptools
protocol with torpor's HTTP limits, ``shared.web.protocol``: 400/408/431/503 are unchanged,
they act before this code runs) hands an ordinary proxied request straight to the pooled
upstream connection, and writes the sandbox's answer back with one ``transport.write``.

What takes the fast path: a request naming a sandbox whose record is cached, running and has a
host; authorised by the sandbox's token or public traffic (no API key: that needs a KV read);
no body or a ``Content-Length`` body of at most ``FAST_BODY_BYTES`` (read in full, under the
same size and time limits, before anything goes to the sandbox); not from a
trusted reverse proxy (their X-Forwarded-* are the ASGI middleware's); not a WebSocket upgrade.
Everything else -- and any refusal, a paused sandbox (auto-resume), a refused connection (the
boot-grace retry) -- runs the ASGI app (``ProxyApp``) exactly as before, on the same request
object, before a byte has been read from the client or sent to the sandbox. The request head is
parsed by llhttp (uvicorn's parser: conflicting Content-Length / Transfer-Encoding, NUL bytes
and bad framing are a 400 before this code runs) and sent on rebuilt from the parsed headers,
never as the client's raw bytes.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, cast

import structlog
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from services.proxy.activity import is_activity
from services.proxy.forwarding import HOP_BY_HOP, request_head
from services.proxy.routing import BadTargetError, target_of, upstream_host
from services.proxy.upstream import (
    UpstreamConnection,
    UpstreamError,
    send_once_more_if_stale,
    watching,
)
from shared.web.limits import HttpLimits
from shared.web.protocol import guarded_protocol, refusal
from shared.web.requests import BodyReader, RequestRefused

if TYPE_CHECKING:
    from starlette.types import Receive

    from services.proxy.ports import ProxyCore
    from services.proxy.routing import Target

log = structlog.get_logger()

# Larger (or chunked) request bodies are streamed by the ASGI path with its size and time limits.
FAST_BODY_BYTES = 64 * 1024
_NO_BODY_STATUS = frozenset({204, 304})


class _NotFast(Exception):
    """This exchange belongs to the ASGI path (nothing has been sent or consumed yet)."""


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The declared body size; ``None`` when the body is chunked or the header unreadable."""
    length = 0
    for name, value in headers:
        if name == b"content-length":
            if not value.isdigit() or len(value) > 18:
                return None
            length = int(value)
        elif name == b"transfer-encoding":
            return None
    return length


def response_head(
    status: int,
    headers: list[tuple[bytes, bytes]],
    default_headers: list[tuple[bytes, bytes]],
    *,
    keep_alive: bool,
    chunked: bool,
) -> bytes:
    """The client's response head: the sandbox's headers (already validated by llhttp) minus
    hop-by-hop ones, the server's defaults first, as the ASGI path writes them."""
    parts = [STATUS_LINE[status]]
    for name, value in default_headers:
        parts += [name, b": ", value, b"\r\n"]
    for name, value in headers:
        if name.lower() not in HOP_BY_HOP:
            parts += [name, b": ", value, b"\r\n"]
    if chunked:
        parts.append(b"transfer-encoding: chunked\r\n")
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def fast_protocol(proxy: ProxyCore, limits: HttpLimits) -> type[HttpToolsProtocol]:
    """uvicorn's ``http=`` class for the proxy: the guarded protocol plus the fast path."""
    guarded = guarded_protocol(limits)

    class FastProxyProtocol(guarded):  # type: ignore[valid-type,misc]
        def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
            if app is not self.app or (self.client and limits.is_trusted(self.client[0])):
                super()._start_asgi_task(cycle, app)  # 503 (limit_concurrency), forwarded-for
                return
            task = self.loop.create_task(self._run(cycle, app))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)

        async def _run(self, cycle: RequestResponseCycle, app: Any) -> None:
            try:
                await _exchange(proxy, self, cycle)
            except _NotFast:
                await cycle.run_asgi(app)
            except Exception as e:
                log.exception("fast_path_failed", error=repr(e))
                if not cycle.response_started:
                    _finish(cycle, refusal(500, "proxy error"), close=True)
                elif not self.transport.is_closing():
                    self.transport.close()

    return FastProxyProtocol


def _route(proxy: ProxyCore, cycle: RequestResponseCycle) -> tuple[Target, str, int]:
    """Target, upstream host and the body length, or ``_NotFast``."""
    scope: Any = cycle.scope
    wiring = proxy.wiring
    if wiring is None or proxy.waker is None or proxy.activity is None:
        raise _NotFast
    headers: list[tuple[bytes, bytes]] = scope["headers"]
    try:
        target = target_of(headers)
    except BadTargetError:
        raise _NotFast from None
    if target is None:
        raise _NotFast
    length = _content_length(headers)
    if length is None or length > FAST_BODY_BYTES or length > proxy.settings.max_body_bytes:
        raise _NotFast
    record = wiring.records.peek(target.sandbox_id)
    if record is None or proxy.waker.needs_waking(record):
        raise _NotFast
    if wiring.keys is not None and any(name == b"x-api-key" for name, _ in headers):
        raise _NotFast
    from services.proxy.access import RefusedError

    try:
        proxy.authorise_by_token(scope, target, record)
    except RefusedError:
        raise _NotFast from None
    return target, upstream_host(record), length


async def _exchange(
    proxy: ProxyCore, protocol: HttpToolsProtocol, cycle: RequestResponseCycle
) -> None:
    started = time.perf_counter()
    target, host, _ = _route(proxy, cycle)
    scope: Any = cycle.scope
    try:
        address = proxy.in_flight.acquire(scope)
    except RequestRefused:
        raise _NotFast from None  # the ASGI path answers the 429
    try:
        assert proxy.activity is not None
        if is_activity(target.is_daemon, scope["path"]):
            proxy.activity.seen(target.sandbox_id)
        body = bytes(cycle.body)
        if cycle.more_body:  # the head came first (as most clients write it): wait for the rest
            read = await _read_body(proxy, cycle)
            if read is None:
                return
            body = read
        pool = proxy.upstream_pool()
        port = target.port
        async with proxy.slot(host, port):
            conn = pool.idle_connection(host, port)
            if conn is None:
                try:
                    conn = await pool.new_connection(host, port)
                except (OSError, TimeoutError):
                    # Refused: the ASGI path retries (boot grace). Hand it the body as unread.
                    cycle.body = bytearray(body)
                    cycle.message_event.set()
                    raise _NotFast from None
            request = request_head(scope, host=host, port=port, chunked=False) + body
            try:
                conn, (status, headers) = await send_once_more_if_stale(
                    conn, lambda c: _send(c, request), lambda: pool.new_connection(host, port)
                )
            except (UpstreamError, OSError, TimeoutError) as e:  # the connection is aborted
                proxy.count_refusal(502)
                message = f"The sandbox {target.sandbox_id}: {e}"
                _finish(cycle, refusal(502, message), close=True)
                return
            proxy.observe_proxied(time.perf_counter() - started, fast=True)
            try:
                await _respond(protocol, cycle, conn, status, headers)
            finally:
                pool.release(conn)
    finally:
        proxy.in_flight.release(address)


async def _read_body(proxy: ProxyCore, cycle: RequestResponseCycle) -> bytes | None:
    """The rest of a small declared body, under the ASGI path's size and time limits; ``None``
    when the client went away or the request was refused (answered here)."""
    reader = BodyReader(
        cast("Receive", cycle.receive),
        limit=proxy.settings.max_body_bytes,
        idle=proxy.limits.body_idle_timeout,
        total=proxy.settings.body_timeout,
    )
    try:
        body, gone = await reader.read_all()
    except RequestRefused as e:
        proxy.count_refusal(e.status)
        _finish(cycle, refusal(e.status, e.message), close=True)
        return None
    return None if gone else body


async def _send(conn: UpstreamConnection, request: bytes) -> tuple[int, list[tuple[bytes, bytes]]]:
    conn.start_request()
    await conn.write(request)
    return await conn.response_head()


def _finish(cycle: RequestResponseCycle, data: bytes, *, close: bool) -> None:
    """Write the last bytes of a response and hand the connection back to uvicorn (keep-alive
    timer, pipelined requests) -- what ``RequestResponseCycle.send`` does at the end."""
    cycle.response_started = True
    transport = cycle.transport
    if not cycle.disconnected:
        transport.write(data)
    cycle.response_complete = True
    cycle.message_event.set()
    if close or not cycle.keep_alive:
        cycle.keep_alive = False
        transport.close()
    cycle.on_response()


async def _respond(
    protocol: HttpToolsProtocol,
    cycle: RequestResponseCycle,
    conn: UpstreamConnection,
    status: int,
    headers: list[tuple[bytes, bytes]],
) -> None:
    scope: Any = cycle.scope
    head_only = scope["method"] == "HEAD"
    if head_only:
        conn.end_without_body()
    has_length = any(name.lower() == b"content-length" for name, _ in headers)
    chunked = not (has_length or head_only or status in _NO_BODY_STATUS)
    default_headers = protocol.server_state.default_headers
    if conn.finished:  # the common case: all of it is here, one write
        body = b"" if head_only else conn.buffered_body()
        if chunked:
            body = (b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)) if body else b"0\r\n\r\n"
        head = response_head(
            status, headers, default_headers, keep_alive=cycle.keep_alive, chunked=chunked
        )
        _finish(cycle, head + body, close=False)
        return
    # A response still coming (a stream): forward each piece, stop when the client goes away.
    cycle.response_started = True
    head = response_head(
        status, headers, default_headers, keep_alive=cycle.keep_alive, chunked=chunked
    )
    cycle.transport.write(head)
    ended = True
    async with watching(_watch_client(cycle, conn)):
        while True:
            try:
                chunk = await conn.next_body()
            except UpstreamError as e:  # the sandbox (or the client) went away mid-stream
                log.info("upstream_stream_ended", error=repr(e))
                ended = False  # closed without the answer's end: the client sees it broken
                break
            if chunk is None or cycle.disconnected:
                break
            cycle.transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
            if cycle.flow.write_paused:
                await cycle.flow.drain()
    _finish(cycle, b"0\r\n\r\n" if chunked and ended else b"", close=not ended)


async def _watch_client(cycle: RequestResponseCycle, conn: UpstreamConnection) -> None:
    """uvicorn sets ``disconnected`` and the cycle's event when the client's connection is
    lost: then stop reading the sandbox's stream."""
    while not cycle.disconnected:
        cycle.message_event.clear()
        await cycle.message_event.wait()
    conn.abort()
