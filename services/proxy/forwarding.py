"""Moving bytes: HTTP (streamed both ways, so Connect server streams and large bodies flow
through without buffering) and WebSocket, between an ASGI connection and a sandbox port."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import structlog
from starlette.types import Message, Receive, Scope, Send
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from services.proxy.upstream import (
    UpstreamConnection,
    UpstreamError,
    UpstreamPool,
    send_once_more_if_stale,
    watching,
)
from shared.web.requests import RequestRefused

log = structlog.get_logger()

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
    }
)
# Never forwarded into a sandbox: torpor's own credentials and routing.
PRIVATE = frozenset(
    {b"x-api-key", b"e2b-sandbox-id", b"e2b-sandbox-port", b"e2b-traffic-access-token"}
)


class UpstreamUnreachableError(Exception):
    """Nothing accepted the connection on the sandbox port."""


class _ClientGoneError(Exception):
    pass


def request_headers(scope: Scope, *, client_host: str | None) -> list[tuple[bytes, bytes]]:
    out = [
        (k, v)
        for k, v in scope.get("headers", [])
        if k.lower() not in HOP_BY_HOP
        and k.lower() not in PRIVATE
        and not k.lower().startswith(b"sec-websocket-")
    ]
    host = next((v for k, v in scope.get("headers", []) if k.lower() == b"host"), None)
    if host is not None:
        out.append((b"x-forwarded-host", host))
    if client_host:
        out.append((b"x-forwarded-for", client_host.encode()))
    out.append((b"x-forwarded-proto", scope.get("scheme", "http").encode()))
    return out


def _has_body(scope: Scope) -> bool:
    for k, v in scope.get("headers", []):
        name = k.lower()
        if name == b"transfer-encoding":
            return True
        if name == b"content-length":
            return v.strip() not in (b"", b"0")
    return False


def _target_url(scheme: str, host: str, port: int, scope: Scope) -> str:
    path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string", b"")
    url = f"{scheme}://{host}:{port}{path.decode('latin-1')}"
    return f"{url}?{query.decode('latin-1')}" if query else url


class UpstreamFailedError(Exception):
    """The sandbox accepted the connection but no response came back."""


class RequestBody:
    """The client's request body, read once however often the connect is retried: the first
    message is read only once a connection exists, so it can go out with the request head in
    one write, and a refused connect consumes nothing."""

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self._receive = receive
        self.present = _has_body(scope)
        self.chunked = self.present and any(
            k.lower() == b"transfer-encoding" for k, _ in scope.get("headers", [])
        )
        self.first = b""
        self.complete = not self.present
        self._fetched = not self.present

    async def prefetch(self) -> None:
        if self._fetched:
            return
        self._fetched = True
        message = await self._receive()
        if message["type"] == "http.disconnect":
            raise _ClientGoneError
        self.first = message.get("body", b"")
        self.complete = not message.get("more_body", False)

    async def rest(self) -> AsyncIterator[bytes]:
        while not self.complete:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                raise _ClientGoneError
            self.complete = not message.get("more_body", False)
            if chunk := message.get("body", b""):
                yield chunk

    def frame(self, chunk: bytes) -> bytes:
        if not self.chunked or not chunk:
            return chunk
        return b"%x\r\n%b\r\n" % (len(chunk), chunk)

    def end(self) -> bytes:
        return b"0\r\n\r\n" if self.chunked else b""


_NOT_FORWARDED = HOP_BY_HOP | PRIVATE | {b"expect"}  # 100-continue is uvicorn's, not the sandbox's


def request_head(scope: Scope, *, host: str, port: int, chunked: bool) -> bytes:
    path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string", b"")
    parts = [scope["method"].encode(), b" ", path]
    if query:
        parts += [b"?", query]
    parts += [b" HTTP/1.1\r\nhost: ", f"{host}:{port}".encode(), b"\r\n"]
    forwarded_host = None
    for k, v in scope.get("headers", []):
        name = k.lower()
        if name == b"host":
            forwarded_host = v
        if name in _NOT_FORWARDED or name.startswith(b"sec-websocket-"):
            continue
        parts += [name, b": ", v, b"\r\n"]
    if forwarded_host is not None:
        parts += [b"x-forwarded-host: ", forwarded_host, b"\r\n"]
    client = scope.get("client")
    if client:
        parts += [b"x-forwarded-for: ", str(client[0]).encode(), b"\r\n"]
    parts += [b"x-forwarded-proto: ", scope.get("scheme", "http").encode(), b"\r\n"]
    if chunked:
        parts.append(b"transfer-encoding: chunked\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


async def _connect(pool: UpstreamPool, host: str, port: int) -> UpstreamConnection:
    try:
        return await pool.new_connection(host, port)
    except (OSError, TimeoutError) as e:
        raise UpstreamUnreachableError(str(e) or repr(e)) from e


async def forward_http(
    pool: UpstreamPool,
    scope: Scope,
    receive: Receive,
    send: Send,
    body: RequestBody,
    *,
    host: str,
    port: int,
) -> int:
    """Proxy one HTTP exchange; returns the upstream status. ``UpstreamUnreachableError`` when the
    connection is refused (nothing has been sent to the client, nor read from it, then)."""
    conn = pool.idle_connection(host, port) or await _connect(pool, host, port)
    try:
        await body.prefetch()
    except _ClientGoneError:
        pool.release(conn)
        return 499
    except RequestRefused:  # too large or too slow: the caller answers; nothing was sent
        pool.release(conn)
        raise
    if not body.complete and conn.reused:
        # A streamed body cannot be replayed if the idle connection turns out to be stale.
        conn.abort()
        conn = await _connect(pool, host, port)
    request = request_head(scope, host=host, port=port, chunked=body.chunked)
    request += body.frame(body.first)
    if body.complete:
        request += body.end()
    try:  # on a failure the connection is aborted
        conn, (status, headers) = await send_once_more_if_stale(
            conn,
            lambda c: _exchange(c, body, request),
            lambda: _connect(pool, host, port),
            replayable=body.complete,
        )
    except _ClientGoneError:
        return 499
    except RequestRefused:  # the body went over a limit halfway: the sandbox saw part of it
        raise
    except UpstreamError as e:
        raise UpstreamFailedError(str(e)) from e
    if scope["method"] == "HEAD":
        conn.end_without_body()
    try:
        await _pump_response(conn, status, headers, receive, send)
    finally:
        pool.release(conn)
    return status


async def _exchange(
    conn: UpstreamConnection, body: RequestBody, request: bytes
) -> tuple[int, list[tuple[bytes, bytes]]]:
    conn.start_request()
    await conn.write(request)
    if not body.complete:
        async for chunk in body.rest():
            await conn.write(body.frame(chunk))
        await conn.write(body.end())
    return await conn.response_head()


async def _pump_response(
    conn: UpstreamConnection,
    status: int,
    headers: list[tuple[bytes, bytes]],
    receive: Receive,
    send: Send,
) -> None:
    out = [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]
    await send({"type": "http.response.start", "status": status, "headers": out})
    if conn.finished:  # the common case: all of it is here, one body message
        await send({"type": "http.response.body", "body": conn.buffered_body()})
        return

    # A response still coming (a stream): stop reading it when the client goes away.
    async def client_gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        conn.abort()

    async with watching(client_gone()):
        while True:
            try:
                chunk = await conn.next_body()
            except UpstreamError as e:  # the sandbox (or the client) went away mid-stream
                # Unfinished on purpose: uvicorn then closes the client's connection without
                # the answer's end (no last chunk), so the client sees a broken answer.
                log.info("upstream_stream_ended", error=repr(e))
                return
            if chunk is None:
                break
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def forward_websocket(
    scope: Scope, receive: Receive, send: Send, *, host: str, port: int, open_timeout: float
) -> None:
    first = await receive()
    if first["type"] != "websocket.connect":
        return
    headers = [
        (k.decode("latin-1"), v.decode("latin-1"))
        for k, v in request_headers(scope, client_host=None)
        if k.lower() not in (b"origin",)
    ]
    try:
        upstream = await ws_connect(
            _target_url("ws", host, port, scope),
            additional_headers=headers,
            subprotocols=scope.get("subprotocols") or None,
            open_timeout=open_timeout,
            max_size=None,
            compression=None,
        )
    except (OSError, TimeoutError) as e:
        raise UpstreamUnreachableError(str(e)) from e
    except Exception as e:
        log.info("websocket_upstream_refused", error=repr(e))
        await send({"type": "websocket.close", "code": 1011})
        return
    await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})

    async def client_to_upstream() -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "websocket.disconnect":
                await upstream.close()
                return
            if message.get("bytes") is not None:
                await upstream.send(message["bytes"])
            elif message.get("text") is not None:
                await upstream.send(message["text"])

    async def upstream_to_client() -> None:
        with contextlib.suppress(ConnectionClosed):
            async for data in upstream:
                if isinstance(data, bytes):
                    await send({"type": "websocket.send", "bytes": data})
                else:
                    await send({"type": "websocket.send", "text": data})
        await send({"type": "websocket.close", "code": upstream.close_code or 1000})

    tasks = {asyncio.create_task(client_to_upstream()), asyncio.create_task(upstream_to_client())}
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task
        await upstream.close()
