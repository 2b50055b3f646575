"""A stand-in for a sandbox port (the daemon or a user's server): echo, streaming, large bodies,
WebSocket. Real sockets, real uvicorn: only the sandbox itself is missing."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket


class UpstreamState:
    def __init__(self) -> None:
        self.requests = 0
        # threading events: set and read across the test thread and the server's loop thread
        self.stream_closed = threading.Event()
        self.release = threading.Event()


def build_upstream(state: UpstreamState) -> Starlette:
    async def echo(request: Request) -> JSONResponse:
        state.requests += 1
        return JSONResponse(
            {
                "path": request.url.path,
                "query": request.url.query,
                "headers": dict(request.headers.items()),
                # in order, repeats kept: which of a repeated header arrived
                "header_list": [
                    [k.decode("latin-1"), v.decode("latin-1")] for k, v in request.headers.raw
                ],
                "method": request.method,
            }
        )

    async def digest(request: Request) -> JSONResponse:
        h = hashlib.sha256()
        size = 0
        async for chunk in request.stream():
            h.update(chunk)
            size += len(chunk)
        return JSONResponse({"sha256": h.hexdigest(), "size": size})

    async def big(request: Request) -> StreamingResponse:
        size = int(request.query_params["size"])

        async def gen() -> AsyncIterator[bytes]:
            block = b"x" * 65536
            left = size
            while left > 0:
                yield block[: min(left, len(block))]
                left -= min(left, len(block))

        return StreamingResponse(gen(), media_type="application/octet-stream")

    async def gated(request: Request) -> StreamingResponse:
        """First chunk now, the second only after the test releases it: proves streaming."""

        async def gen() -> AsyncIterator[bytes]:
            yield b"first\n"
            while not state.release.is_set():
                await asyncio.sleep(0.01)
            yield b"second\n"

        return StreamingResponse(gen(), media_type="text/plain")

    async def endless(request: Request) -> StreamingResponse:
        async def gen() -> AsyncIterator[bytes]:
            try:
                while True:
                    yield b"tick\n"
                    await asyncio.sleep(0.05)
            finally:
                state.stream_closed.set()

        return StreamingResponse(gen(), media_type="text/plain")

    async def health(request: Request) -> Response:
        return Response(status_code=204)

    async def ws(websocket: WebSocket) -> None:
        await websocket.accept(subprotocol=(websocket.scope.get("subprotocols") or [None])[0])
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                if message.get("text") is not None:
                    await websocket.send_text("echo:" + message["text"])
                elif message.get("bytes") is not None:
                    await websocket.send_bytes(message["bytes"][::-1])
        except Exception:
            return

    return Starlette(
        routes=[
            Route("/echo", echo, methods=["GET", "POST", "PUT", "DELETE"]),
            Route("/digest", digest, methods=["POST", "PUT"]),
            Route("/big", big),
            Route("/gated", gated),
            Route("/endless", endless),
            Route("/health", health),
            WebSocketRoute("/ws", ws),
        ]
    )
