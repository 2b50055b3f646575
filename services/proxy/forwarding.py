"""Moving bytes: HTTP (streamed both ways, so Connect server streams and large bodies flow
through without buffering) and WebSocket, between an ASGI connection and a sandbox port."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import structlog
from starlette.types import Message, Receive, Scope, Send
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

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
PRIVATE = frozenset({b"x-api-key", b"e2b-sandbox-id", b"e2b-sandbox-port"})


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


async def forward_http(
    client: httpx.AsyncClient,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    host: str,
    port: int,
) -> int:
    """Proxy one HTTP exchange; returns the upstream status. ``UpstreamUnreachableError`` when the
    connection is refused (nothing has been sent to the client then)."""
    body_done = asyncio.Event()
    has_body = _has_body(scope)
    if not has_body:
        body_done.set()

    async def body() -> AsyncIterator[bytes]:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGoneError
            if chunk := message.get("body", b""):
                yield chunk
            if not message.get("more_body", False):
                break
        body_done.set()

    client_addr = scope.get("client")
    request = client.build_request(
        scope["method"],
        _target_url("http", host, port, scope),
        headers=request_headers(scope, client_host=client_addr[0] if client_addr else None),
        content=body() if has_body else None,
    )
    try:
        response = await client.send(request, stream=True)
    except httpx.ConnectError as e:
        raise UpstreamUnreachableError(str(e)) from e
    try:
        await _pump_response(response, receive, send, body_done)
    finally:
        await response.aclose()
    return response.status_code


async def _pump_response(
    response: httpx.Response, receive: Receive, send: Send, body_done: asyncio.Event
) -> None:
    headers = [(k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP]

    async def pump() -> None:
        start = {"type": "http.response.start", "status": response.status_code, "headers": headers}
        await send(start)
        try:
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError as e:  # the sandbox went away mid-stream: end what we have
            log.info("upstream_stream_ended", error=repr(e))
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def client_gone() -> None:
        # Only after the request body was read: receive() belongs to the body until then.
        await body_done.wait()
        while (await receive())["type"] != "http.disconnect":
            pass

    pump_task = asyncio.create_task(pump())
    gone_task = asyncio.create_task(client_gone())
    try:
        await asyncio.wait({pump_task, gone_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (pump_task, gone_task):
            task.cancel()
        for task in (pump_task, gone_task):
            with contextlib.suppress(asyncio.CancelledError, _ClientGoneError, OSError):
                await task
    exc = pump_task.exception() if pump_task.done() and not pump_task.cancelled() else None
    if exc is not None and not isinstance(exc, _ClientGoneError | OSError):
        raise exc


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
            subprotocols=scope.get("subprotocols") or None,  # type: ignore[arg-type]
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
