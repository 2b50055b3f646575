"""A lean HTTP/1.1 client for the hot path: pooled keep-alive connections to sandbox ports,
parsed with httptools (what uvicorn parses with), bodies streamed both ways with back-pressure.

Why not httpx: per request it cost the proxy ~1 ms of CPU (request/response models, anyio,
h11, pool bookkeeping), more than the daemon spends answering. Here a request is one write of
the head (plus the body when it is already complete) and a parser fed from ``data_received``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar, cast

import httptools

# A reused connection may have been closed by the server meanwhile (uvicorn's default keep-alive
# is 5 s); idle ones older than this are dropped instead of reused.
IDLE_EXPIRY = 4.0
_HIGH_WATER = 1 << 20  # buffered response bytes before reading from the sandbox pauses
_LOW_WATER = 1 << 18
# A sandbox is untrusted: llhttp buffers a response head of any size, so bound it (bytes and
# header count); a longer head is a broken response (502), not proxy memory.
MAX_RESPONSE_HEAD = 64 * 1024
MAX_RESPONSE_HEADERS = 256

_FRAMING = frozenset({b"content-length", b"transfer-encoding"})

T = TypeVar("T")


class UpstreamError(Exception):
    """The connection broke; ``sent_nothing`` when the server cannot have seen the request."""


class Listener(Protocol):
    def upstream_progress(self, conn: UpstreamConnection) -> None:
        """Called after each read from the sandbox and when the connection is lost; the
        listener looks at ``head``, ``finished``, ``error`` and takes the body with
        ``take_chunk`` (the relay's way to avoid futures and tasks on the hot path)."""
        ...


class UpstreamConnection(asyncio.Protocol):
    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.reused = False
        self.listener: Listener | None = None
        # The final response head once it has arrived (status, headers).
        self.head: tuple[int, list[tuple[bytes, bytes]]] | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._headers: list[tuple[bytes, bytes]] = []
        self._header_size = 0
        self._framed = False  # Content-Length or Transfer-Encoding seen in the head
        self._head: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._readable: asyncio.Event = asyncio.Event()
        self._complete = False
        self._closed = False
        self._error: Exception | None = None
        self._keep_alive = True
        self._until_close = False
        self._writable: asyncio.Future[None] | None = None
        self._reading_paused = False
        self.got_response_bytes = False
        self._head_bytes = 0

    # ---- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:  # small writes must not wait for ACKs (Nagle + delayed ACK)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.got_response_bytes = True
        self._feed(data)
        if self.listener is not None:
            self.listener.upstream_progress(self)

    def _feed(self, data: bytes) -> None:
        if self.head is None:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_RESPONSE_HEAD + _HIGH_WATER:  # head + what came with it
                self._fail(UpstreamError("response head from the sandbox is too large"))
                return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamError("upgrade responses are not proxied over plain HTTP"))
        except httptools.HttpParserError as e:
            if isinstance(e.__context__, UpstreamError):  # raised by a callback of ours
                self._fail(e.__context__)
            else:
                self._fail(UpstreamError(f"bad response from the sandbox: {e}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._until_close and self.head is not None:
            self._complete = True  # a body delimited by the connection closing has ended
            self._readable.set()
        if not self._complete:
            self._fail(UpstreamError(f"the sandbox closed the connection: {exc!r}"))
        if self._writable is not None and not self._writable.done():
            self._writable.set_exception(UpstreamError("connection lost while sending"))
        if self.listener is not None:
            self.listener.upstream_progress(self)

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # ---- httptools callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._complete:
            # A second response to one request (or bytes nobody asked for): relaying it would
            # let the sandbox answer the client's next request, perhaps to another sandbox.
            raise UpstreamError("the sandbox sent more than one response")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        self._header_size += len(name) + len(value)
        if self._header_size > MAX_RESPONSE_HEAD or len(self._headers) > MAX_RESPONSE_HEADERS:
            raise UpstreamError("response head from the sandbox is too large")
        if len(name) in (14, 17) and name.lower() in _FRAMING:
            self._framed = True

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # interim (100 Continue): the real head follows
            self._headers = []
            self._header_size = 0
            self._framed = False
            return
        self._keep_alive = self._parser.should_keep_alive()
        self._until_close = status not in (204, 304) and not self._framed
        self.head = (status, self._headers)
        if self._head is not None and not self._head.done():
            self._head.set_result(self.head)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        self._readable.set()
        if self._buffered > _HIGH_WATER and not self._reading_paused and self.transport:
            self._reading_paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self.head is None:
            return  # the end of an interim response
        self._complete = True
        self._readable.set()

    # ---- used by the forwarder ---------------------------------------------------------------

    def _fail(self, error: Exception) -> None:
        if self._error is None:
            self._error = error
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        self._readable.set()
        if self.transport is not None:
            self.transport.abort()

    @property
    def reusable(self) -> bool:
        return (
            self._complete
            and self._keep_alive
            and not self._closed
            and self.transport is not None
            and not self.transport.is_closing()
        )

    def start_request(self, listener: Listener | None = None) -> None:
        """Before a request is written; the response goes to ``listener`` (its callbacks) or,
        without one, to ``response_head``/``next_body`` (awaited)."""
        self._headers = []
        self._header_size = 0
        self._head_bytes = 0
        self._framed = False
        self.head = None
        self.listener = listener
        self._head = None if listener else asyncio.get_running_loop().create_future()
        self._chunks.clear()
        self._buffered = 0
        self._readable.clear()
        self._complete = False
        self._until_close = False
        self.got_response_bytes = False

    async def write(self, data: bytes) -> None:
        if self._closed or self.transport is None or self.transport.is_closing():
            raise self._error or UpstreamError("the connection to the sandbox is closed")
        self.transport.write(data)
        if self._writable is not None and not self._writable.done():
            await self._writable

    async def response_head(self) -> tuple[int, list[tuple[bytes, bytes]]]:
        assert self._head is not None
        return await self._head

    def end_without_body(self) -> None:
        """A HEAD response carries no body whatever its headers say; the parser cannot know
        that, so the connection is not reused."""
        self._keep_alive = False
        self._complete = True

    @property
    def finished(self) -> bool:
        """The whole response has arrived (and is buffered)."""
        return self._complete

    @property
    def error(self) -> Exception | None:
        """Why the connection broke (``None`` while it works)."""
        return self._error

    def take_chunk(self) -> bytes | None:
        """The next buffered piece of the body, without waiting (``None``: nothing buffered)."""
        if not self._chunks:
            return None
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        if self._reading_paused and self._buffered < _LOW_WATER and self.transport:
            self._reading_paused = False
            self.transport.resume_reading()
        return chunk

    def buffered_body(self) -> bytes:
        body = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        return body

    async def next_body(self) -> bytes | None:
        """The next piece of the response body; ``None`` at its end."""
        while not self._chunks:
            if self._complete:
                return None
            if self._error is not None:
                raise self._error
            self._readable.clear()
            await self._readable.wait()
        return self.take_chunk()

    def abort(self) -> None:
        self._closed = True
        if self._head is not None and not self._head.done():
            self._head.cancel()  # nobody awaits it any more: no "exception never retrieved"
        if self.transport is not None:
            self.transport.abort()


class UpstreamPool:
    """Idle keep-alive connections per (host, port), most recently used first."""

    def __init__(self, *, connect_timeout: float, max_idle_per_target: int = 64) -> None:
        self._connect_timeout = connect_timeout
        self._max_idle = max_idle_per_target
        self._idle: dict[tuple[str, int], list[UpstreamConnection]] = {}

    def idle_connection(self, host: str, port: int) -> UpstreamConnection | None:
        idle = self._idle.get((host, port))
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.reusable and now - conn.idle_since < IDLE_EXPIRY:
                conn.reused = True
                return conn
            conn.abort()
        return None

    async def new_connection(self, host: str, port: int) -> UpstreamConnection:
        """``ConnectionRefusedError``/``OSError``/``TimeoutError`` when nothing accepts."""
        loop = asyncio.get_running_loop()
        key = (host, port)
        async with asyncio.timeout(self._connect_timeout):
            _, conn = await loop.create_connection(lambda: UpstreamConnection(key), host, port)
        return conn

    def release(self, conn: UpstreamConnection) -> None:
        conn.listener = None
        if not conn.reusable:
            conn.abort()
            return
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= self._max_idle:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.abort()
        self._idle.clear()


async def send_once_more_if_stale(
    conn: UpstreamConnection,
    send: Callable[[UpstreamConnection], Awaitable[T]],
    reconnect: Callable[[], Awaitable[UpstreamConnection]],
    *,
    replayable: bool = True,
) -> tuple[UpstreamConnection, T]:
    """``send`` a request on ``conn`` and return the connection that answered with the answer.

    A reused keep-alive connection the sandbox closed meanwhile fails before any response byte:
    the sandbox saw nothing, so the request goes once more on a new connection, if it can be
    sent again (``replayable``: a streamed body cannot). On any failure the connection in use
    is aborted before the exception propagates."""
    try:
        return conn, await send(conn)
    except UpstreamError:
        conn.abort()
        if not (replayable and conn.reused and not conn.got_response_bytes):
            raise
    except BaseException:
        conn.abort()
        raise
    conn = await reconnect()
    try:
        return conn, await send(conn)
    except BaseException:
        conn.abort()
        raise


@contextlib.asynccontextmanager
async def watching(client_gone: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """Run ``client_gone`` beside a streamed response (it returns when the client has gone and
    aborts the upstream connection, which ends the stream); stop it when the stream is done."""
    watcher = asyncio.get_running_loop().create_task(client_gone)
    try:
        yield
    finally:
        if not watcher.done():
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
