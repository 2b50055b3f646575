"""The proxy's connection protocol: ordinary proxied exchanges relayed from transport callbacks;
every other connection handed, unread, to uvicorn's protocol (``fastpath.fast_protocol``).

Why: under uvicorn even the fast path cost the proxy 300-500 us of CPU per request (a scope,
a cycle, a task and several awaited futures per request, each an event-loop pass), which kept it
at 0.7-0.8 of direct throughput. Here a request is parsed (llhttp, through httptools) in
``data_received``, sent to a pooled upstream connection with one write, and the answer is
written to the client from the upstream connection's ``data_received``: no task, no future, no
coroutine on the hot path.

What is relayed: an HTTP/1.1 request whose whole head arrived in one piece, within the head
limits; an origin-form target (``/...``); a method other than HEAD/CONNECT; no
Transfer-Encoding, Expect or Upgrade; no body or a ``Content-Length`` body of at most
``FAST_BODY_BYTES``; a sandbox named whose record is cached, running and has a host;
authorised by the sandbox's token or public traffic (no API key: that needs a KV read); a client
that is not a trusted reverse proxy, on plain TCP. Auth runs for every request: a connection may
switch sandbox or token between requests.

Everything else -- a head in pieces (slowloris, 408), too large or too many headers (431),
anything llhttp refuses (400: NUL bytes, conflicting Content-Length/Transfer-Encoding, bad
framing), an API key, a refusal, a paused sandbox (auto-resume), a refused connection (the
boot-grace retry), chunked or large bodies, WebSocket -- hands the connection to the guarded
uvicorn protocol, which then owns it: the bytes from the start of that request on are fed to it
as if it had read them, so it answers exactly as it did before this module existed. A handover
happens only between exchanges, never while an answer is being written.

The request sent to the sandbox is rebuilt from the parsed head (hop-by-hop and torpor's own
headers dropped), never the client's raw bytes; its body is exactly the declared length.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import httptools
import structlog

from services.proxy.access import RefusedError
from services.proxy.activity import is_activity
from services.proxy.fastpath import FAST_BODY_BYTES, fast_protocol, response_head
from services.proxy.forwarding import HOP_BY_HOP, PRIVATE
from services.proxy.routing import BadTargetError, Target, target_from, upstream_host
from services.proxy.upstream import UpstreamConnection, UpstreamError
from shared.web.protocol import per_client_counts, refusal

if TYPE_CHECKING:
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    from services.proxy.ports import ProxyCore
    from services.proxy.slots import ExchangeSlots
    from shared.web.limits import HttpLimits

log = structlog.get_logger()

_NOT_FORWARDED = HOP_BY_HOP | PRIVATE | {b"expect"}
# Request headers that send the exchange to uvicorn (its framing, 100-continue, upgrades).
_NOT_RELAYED = frozenset({b"transfer-encoding", b"expect", b"upgrade"})
_NO_BODY_STATUS = frozenset({204, 304})
# Request headers that route or authorise; the head's one scan keeps the first of each.
_ROUTING = frozenset({b"e2b-sandbox-id", b"e2b-sandbox-port", b"host", b"x-api-key"})

_tasks: set[asyncio.Task[None]] = set()  # strong references to the few spawned tasks

# What the connection's single timer is waiting for.
_HEAD, _BODY, _IDLE, _BUSY = range(4)


class _Handover(Exception):
    """This request (and the connection) belongs to uvicorn's protocol."""


def relay_protocol(proxy: ProxyCore, limits: HttpLimits) -> type[asyncio.Protocol]:
    """uvicorn's ``http=`` class for the proxy."""
    slow = fast_protocol(proxy, limits)
    max_head = limits.max_header_bytes
    max_headers = limits.max_headers

    class RelayProtocol(asyncio.Protocol):
        def __init__(
            self,
            config: Config,
            server_state: ServerState,
            app_state: dict[str, Any],
            _loop: asyncio.AbstractEventLoop | None = None,
        ) -> None:
            self.config = config
            self.server_state = server_state
            self.app_state = app_state
            self.loop = _loop or asyncio.get_running_loop()
            self.transport: asyncio.Transport | None = None
            self.client = "-"
            self._counted = False
            self._buf = b""  # unanswered bytes from the client, from a request's first byte
            self._parser = httptools.HttpRequestParser(self)
            # the request being parsed / relayed
            self._url = b""
            self._headers: list[tuple[bytes, bytes]] = []
            self._begun = 0
            self._head_done = False
            self._message_done = False
            self._head_size = 0
            self._need = 0  # bytes of _buf that make up the current request
            self._body_by = 0.0
            self._host = ""
            self._port = 0
            # the first value of each of _ROUTING in the current head
            self._routing: dict[bytes, bytes] = {}
            # the last routing headers' target: a connection names the same sandbox each time
            self._target_key: tuple[bytes | None, bytes | None, bytes | None] | None = None
            self._target: Target | None = None
            self._keep_alive = True
            self._conn: UpstreamConnection | None = None
            self._slots: ExchangeSlots | None = None
            self._in_flight: str | None = None
            self._sandbox = ""
            self._activity = True
            self._started = 0.0
            self._retried = False
            self._head_sent = False
            self._chunked = False
            self._write_paused = False
            self._read_paused = False
            self._closing = False
            # a single lazily re-armed timer: moving the deadline costs no timer call
            self._wait = _HEAD
            self._deadline = 0.0
            self._timer: asyncio.TimerHandle | None = None
            self._timer_at = 0.0

        # ---- connection ---------------------------------------------------------------------

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport  # type: ignore[assignment]
            state = self.server_state
            state.connections.add(self)  # type: ignore[arg-type]
            peer = transport.get_extra_info("peername")
            self.client = str(peer[0]) if isinstance(peer, tuple) else "-"
            per_client = per_client_counts(state)
            if (
                self.config.limit_concurrency is not None
                or transport.get_extra_info("sslcontext") is not None
                or limits.is_trusted(self.client)
                or len(state.connections) > limits.max_connections
            ):
                self._hand_over(b"")
                return
            self._counted = True
            if per_client.add(self.client) > limits.max_connections_per_client:
                self._hand_over(b"")  # the guarded protocol refuses it (503)
                return
            self._set_deadline(_HEAD, limits.header_timeout)

        def connection_lost(self, exc: Exception | None) -> None:
            self._forget()
            self._wait = _BUSY
            if self._conn is not None:  # the client went away mid-exchange
                conn, self._conn = self._conn, None
                conn.listener = None
                conn.abort()
            self._release()  # a queued or connecting exchange finds the transport closed

        def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
            """The rare request that must wait (a new upstream connection, a free slot)."""
            task = self.loop.create_task(coro)
            _tasks.add(task)
            task.add_done_callback(_tasks.discard)

        def _forget(self) -> None:
            self.server_state.connections.discard(self)
            if self._counted:
                self._counted = False
                per_client_counts(self.server_state).remove(self.client)
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def eof_received(self) -> bool | None:
            return None  # as uvicorn: a half-closed client connection is closed

        def pause_writing(self) -> None:
            self._write_paused = True

        def resume_writing(self) -> None:
            self._write_paused = False
            if self._conn is not None and self._head_sent:
                self.upstream_progress(self._conn)

        def shutdown(self) -> None:
            """uvicorn's graceful shutdown: close when idle, else after the answer."""
            if self._wait == _BUSY:
                self._closing = True
            elif self.transport is not None:
                self.transport.close()

        # ---- requests -----------------------------------------------------------------------

        def data_received(self, data: bytes) -> None:
            self._buf = self._buf + data if self._buf else data
            if self._wait == _BUSY:  # pipelined: after this answer (bounded)
                if len(self._buf) > max_head + FAST_BODY_BYTES and not self._read_paused:
                    self._read_paused = True
                    assert self.transport is not None
                    self.transport.pause_reading()
                return
            if self._wait == _BODY:
                if len(self._buf) >= self._need:
                    self._body_complete()
                else:
                    self._wait_for_body()
                return
            self._next()

        def _next(self) -> None:
            """Start the request at the front of ``_buf``."""
            try:
                self._begin()
            except _Handover:
                self._hand_over(self._buf)

        def _begin(self) -> None:
            buf = self._buf
            end = buf.find(b"\r\n\r\n", 0, max_head + 4)
            if end < 0:
                raise _Handover  # a head in pieces or too large: the guarded protocol's limits
            head_size = end + 4
            self._head_size = head_size
            self._url = b""
            self._headers = []
            self._begun = 0
            self._head_done = self._message_done = False
            try:
                self._parser.feed_data(buf[:head_size])
            except (httptools.HttpParserError, httptools.HttpParserUpgrade):  # 400, 101: uvicorn
                raise _Handover from None
            headers = self._headers
            url = self._url
            parser = self._parser
            if (
                self._begun != 1
                or not self._head_done
                or len(headers) > max_headers
                or parser.get_http_version() != "1.1"
                or not url.startswith(b"/")
                or b"#" in url
            ):
                raise _Handover
            method = parser.get_method()
            if method == b"HEAD":
                raise _Handover
            length = 0
            routing: dict[bytes, bytes] = {}
            for name, value in headers:
                if name in _ROUTING:
                    if name not in routing:
                        routing[name] = value
                elif name == b"content-length":
                    if not value.isdigit() or len(value) > 18:
                        raise _Handover
                    length = int(value)
                elif name in _NOT_RELAYED:
                    raise _Handover
            self._routing = routing
            if length > FAST_BODY_BYTES or length > proxy.settings.max_body_bytes:
                raise _Handover
            if length == 0 and not self._message_done:
                raise _Handover  # llhttp expects more than we do
            self._route(headers)
            self._need = head_size + length
            self._started = time.perf_counter()
            self.server_state.total_requests += 1
            if len(buf) >= self._need:
                self._body_complete()
            else:  # the body follows the head (as most clients write it)
                self._body_by = self.loop.time() + proxy.settings.body_timeout
                self._wait_for_body()

        def _wait_for_body(self) -> None:
            idle = limits.body_idle_timeout
            self._set_deadline(_BODY, min(idle, self._body_by - self.loop.time()))

        def _route(self, headers: list[tuple[bytes, bytes]]) -> None:
            """Name, look up and authorise the sandbox, count the request; ``_Handover`` for
            anything the ASGI app must decide."""
            wiring = proxy.wiring
            if wiring is None or proxy.waker is None or proxy.activity is None:
                raise _Handover
            routing = self._routing
            key = (
                routing.get(b"e2b-sandbox-id"),
                routing.get(b"e2b-sandbox-port"),
                routing.get(b"host"),
            )
            if key == self._target_key:
                target = self._target
            else:
                try:
                    target = target_from(*key)
                except BadTargetError:
                    raise _Handover from None
                self._target_key, self._target = key, target
            if target is None:
                raise _Handover
            record = wiring.records.peek(target.sandbox_id)
            if record is None or proxy.waker.needs_waking(record):
                raise _Handover
            if wiring.keys is not None and b"x-api-key" in routing:
                raise _Handover
            try:
                proxy.authorise_by_token({"headers": headers}, target, record)
            except RefusedError:
                raise _Handover from None
            if not proxy.in_flight.try_acquire(self.client):
                raise _Handover  # the ASGI path answers the 429
            self._in_flight = self.client
            self._sandbox = target.sandbox_id
            self._host = upstream_host(record)
            self._port = target.port
            self._wait = _BUSY
            # touched after the request is written (off its path)
            self._activity = is_activity(
                target.is_daemon, self._url.split(b"?", 1)[0].decode("latin-1")
            )

        def _body_complete(self) -> None:
            head_size = self._head_size
            if self._need > head_size:  # keep the parser in step (it waits for the body)
                try:
                    self._parser.feed_data(self._buf[head_size : self._need])
                except httptools.HttpParserError:
                    self._release()
                    self._hand_over(self._buf)
                    return
                if not self._message_done:
                    self._release()
                    self._hand_over(self._buf)
                    return
            self._wait = _BUSY
            self._set_deadline(_BUSY, 0.0)
            slots = proxy.slot(self._host, self._port)
            if slots.try_take():
                self._slots = slots
                self._send()
            else:  # this sandbox port has max_connections exchanges running: queue
                self._spawn(self._queue(slots))

        async def _queue(self, slots: ExchangeSlots) -> None:
            await slots.take()
            if self.transport is None or self.transport.is_closing():
                slots.give()
                self._release()
                return
            self._slots = slots
            self._send()

        def _request(self) -> bytes:
            parts = [
                self._parser.get_method(),
                b" ",
                self._url,
                b" HTTP/1.1\r\nhost: %b:%d\r\n" % (self._host.encode(), self._port),
            ]
            forwarded_host = None
            for name, value in self._headers:
                if name in _NOT_FORWARDED:
                    if name == b"host":
                        forwarded_host = value
                    continue
                if name.startswith(b"sec-websocket-"):
                    continue
                parts += [name, b": ", value, b"\r\n"]
            if forwarded_host is not None:
                parts += [b"x-forwarded-host: ", forwarded_host, b"\r\n"]
            parts += [
                b"x-forwarded-for: ",
                self.client.encode(),
                b"\r\nx-forwarded-proto: http\r\n\r\n",
                self._buf[self._head_size : self._need],
            ]
            return b"".join(parts)

        def _send(self) -> None:
            conn = proxy.upstream_pool().idle_connection(self._host, self._port)
            if conn is None:
                self._spawn(self._connect())
                return
            self._write_request(conn)

        async def _connect(self) -> None:
            try:
                conn = await proxy.upstream_pool().new_connection(self._host, self._port)
            except (OSError, TimeoutError):
                # Refused: the ASGI path retries (boot grace). Nothing was sent anywhere.
                self._release()
                if self.transport is not None and not self.transport.is_closing():
                    self._hand_over(self._buf)
                return
            if self.transport is None or self.transport.is_closing():
                conn.abort()
                self._release()
                return
            self._write_request(conn)

        def _write_request(self, conn: UpstreamConnection) -> None:
            self._conn = conn
            self._head_sent = False
            conn.start_request(self)
            if conn.transport is None or conn.transport.is_closing():
                self._failed(conn, None)  # stale: retried on a new connection right away
                return
            conn.transport.write(self._request())
            if self._activity:
                assert proxy.activity is not None  # checked by _route
                proxy.activity.seen(self._sandbox)  # after the write: off the request's path

        # ---- the sandbox's answer -----------------------------------------------------------

        def upstream_progress(self, conn: UpstreamConnection) -> None:
            if conn is not self._conn or self.transport is None:
                return
            if not self._head_sent:
                if conn.head is None:
                    if conn.error is not None:
                        self._failed(conn, conn.error)
                    return
                self._answer(conn)
                return
            self._stream(conn)

        def _failed(self, conn: UpstreamConnection, error: Exception | None) -> None:
            """No answer came. A reused keep-alive connection the sandbox closed meanwhile saw
            nothing: send once more on a new one; otherwise 502."""
            self._conn = None
            conn.listener = None
            conn.abort()
            if conn.reused and not conn.got_response_bytes and not self._retried:
                self._retried = True
                self._spawn(self._connect())
                return
            proxy.count_refusal(502)
            reason = error or UpstreamError("the connection to the sandbox is closed")
            self._release()
            self._reply(refusal(502, f"The sandbox {self._sandbox}: {reason}"), close=True)

        def _answer(self, conn: UpstreamConnection) -> None:
            assert conn.head is not None
            status, headers = conn.head
            chunked = status not in _NO_BODY_STATUS
            if chunked:
                for name, _ in headers:
                    if len(name) == 14 and name.lower() == b"content-length":
                        chunked = False
                        break
            self._chunked = chunked
            head = response_head(
                status,
                headers,
                self.server_state.default_headers,
                keep_alive=self._keep_alive and not self._closing,
                chunked=chunked,
            )
            waited = time.perf_counter() - self._started
            self._head_sent = True
            if conn.finished:  # the common case: all of it is here, one write
                body = conn.buffered_body()
                if chunked:
                    body = (b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)) if body else b"0\r\n\r\n"
                self._done(conn, head + body, close=False)
            else:
                assert self.transport is not None
                self.transport.write(head)
                self._stream(conn)
            # after the write: the client is not kept waiting for the metrics
            proxy.observe_proxied(waited, fast=True)

        def _stream(self, conn: UpstreamConnection) -> None:
            """A response still coming: forward what is buffered, unless the client is slow
            (then the upstream connection stops reading once its buffer is full)."""
            transport = self.transport
            assert transport is not None
            chunked = self._chunked
            while not self._write_paused:
                chunk = conn.take_chunk()
                if chunk is None:
                    break
                transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
            if self._write_paused:
                return
            if conn.finished:
                self._done(conn, b"0\r\n\r\n" if chunked else b"", close=False)
            elif conn.error is not None:
                log.info("upstream_stream_ended", error=repr(conn.error))
                # Cut short: closed without the answer's end (no last chunk), so the client sees
                # a broken answer, never a complete one that lacks the sandbox's tail.
                self._done(conn, b"", close=True)

        # ---- the end of an exchange ---------------------------------------------------------

        def _release(self) -> None:
            """Give back the slot and the client's in-flight count (once per exchange)."""
            if self._slots is not None:
                self._slots.give()
                self._slots = None
            if self._in_flight is not None:
                proxy.in_flight.release(self._in_flight)
                self._in_flight = None

        def _done(self, conn: UpstreamConnection, data: bytes, *, close: bool) -> None:
            self._conn = None
            proxy.upstream_pool().release(conn)
            self._release()
            self._reply(data, close=close)

        def _reply(self, data: bytes, *, close: bool) -> None:
            transport = self.transport
            assert transport is not None
            transport.write(data)
            self._buf = self._buf[self._need :]
            self._retried = False
            if close or not self._keep_alive or self._closing:
                transport.close()
                return
            if self._read_paused:
                self._read_paused = False
                transport.resume_reading()
            if self._buf:
                self._wait = _HEAD
                self._next()
            else:
                self._set_deadline(_IDLE, self.config.timeout_keep_alive)

        # ---- handing the connection to uvicorn ----------------------------------------------

        def _hand_over(self, data: bytes) -> None:
            transport = self.transport
            assert transport is not None
            proxy.handovers.inc()
            self._forget()
            self._buf = b""
            self._wait = _BUSY  # nothing more comes here
            protocol = slow(
                config=self.config,
                server_state=self.server_state,
                app_state=self.app_state,
                _loop=self.loop,
            )
            transport.set_protocol(protocol)
            protocol.connection_made(transport)
            if self._read_paused:
                self._read_paused = False
                transport.resume_reading()
            if data and not transport.is_closing():
                protocol.data_received(data)

        # ---- the connection's deadline ------------------------------------------------------

        def _set_deadline(self, wait: int, seconds: float) -> None:
            self._wait = wait
            if wait == _BUSY:
                return
            deadline = self.loop.time() + seconds
            self._deadline = deadline
            if self._timer is None or self._timer_at > deadline:
                if self._timer is not None:
                    self._timer.cancel()
                self._timer_at = deadline
                self._timer = self.loop.call_at(deadline, self._timer_fired)

        def _timer_fired(self) -> None:
            self._timer = None
            if self._wait == _BUSY or self.transport is None:
                return  # re-armed when the exchange ends
            now = self.loop.time()
            if now < self._deadline:
                self._timer_at = self._deadline
                self._timer = self.loop.call_at(self._deadline, self._timer_fired)
                return
            transport = self.transport
            if self._wait == _IDLE:
                transport.close()  # keep-alive expired, as uvicorn does
                return
            if self._wait == _HEAD:
                message = f"request head not received within {limits.header_timeout:g}s"
            else:
                message = f"request body stalled for more than {limits.body_idle_timeout:g}s"
                self._release()
            self._wait = _BUSY
            log.info("http_refused", status=408, reason=message)
            with contextlib.suppress(Exception):
                transport.write(refusal(408, message))
            transport.close()

        # ---- httptools callbacks ------------------------------------------------------------

        def on_message_begin(self) -> None:
            self._begun += 1

        def on_url(self, url: bytes) -> None:
            self._url += url

        def on_header(self, name: bytes, value: bytes) -> None:
            self._headers.append((name.lower(), value))

        def on_headers_complete(self) -> None:
            self._head_done = True
            self._keep_alive = self._parser.should_keep_alive()  # llhttp resets it at the end

        def on_message_complete(self) -> None:
            self._message_done = True

    return RelayProtocol
