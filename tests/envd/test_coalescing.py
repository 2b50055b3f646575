"""The daemon's protocol sends each answer with one write (services/envd/coalescing.py), and holds
nothing longer than one event-loop step: streams flow, large bodies obey flow control, a closing
connection gets its answer first.

In-process on a real loopback connection with uvicorn's real protocol machinery; the only spy is
a wrapper counting the real transport's writes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from services.envd.coalescing import FLUSH_BYTES, CoalescingHttpToolsProtocol

Send = Callable[[dict[str, Any]], Awaitable[None]]
App = Callable[[dict[str, Any], Any, Send], Awaitable[None]]


class _Counting:
    """Delegates to the real transport, counting its writes."""

    def __init__(self, transport: asyncio.Transport, writes: list[int]) -> None:
        self._t = transport
        self._writes = writes

    def write(self, data: bytes) -> None:
        self._writes.append(len(data))
        self._t.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


@contextlib.asynccontextmanager
async def serving(app: App) -> AsyncIterator[tuple[int, list[int]]]:
    writes: list[int] = []

    class Proto(CoalescingHttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(_Counting(transport, writes))  # type: ignore[arg-type]

    config = Config(app, lifespan="off", http=Proto, ws="none", log_config=None)
    config.load()
    state = ServerState()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Proto(config=config, server_state=state, app_state={}), "127.0.0.1", 0
    )
    try:
        yield server.sockets[0].getsockname()[1], writes
    finally:
        for conn in list(state.connections):
            conn.shutdown()
        server.close()
        await server.wait_closed()


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await asyncio.wait_for(reader.readexactly(length), 10)


def test_a_unary_answer_is_one_write() -> None:
    body = b'{"processes":[]}'

    async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def main() -> None:
        async with serving(app) as (port, writes):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(3):  # keep-alive: one write per answer, every time
                writer.write(b"POST /x HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\n{}")
                head, got = await read_answer(reader)
                assert head.startswith(b"HTTP/1.1 200 ")
                assert got == body
            assert len(writes) == 3, writes  # uvicorn alone: 6 (head, body)
            writer.close()

    asyncio.run(main())


def test_a_stream_is_not_held_for_more_data() -> None:
    """The first chunk must reach the client while the app waits for the client's word."""

    async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await asyncio.wait_for(seen.wait(), 10)  # set only once "first" arrived
        await send({"type": "http.response.body", "body": b"last"})

    seen = asyncio.Event()

    async def main() -> None:
        async with serving(app) as (port, _writes):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /s HTTP/1.1\r\nhost: a\r\n\r\n")
            await asyncio.wait_for(reader.readuntil(b"first"), 10)
            seen.set()
            assert b"last" in await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10)
            writer.close()

    asyncio.run(main())


@pytest.mark.parametrize("size", [FLUSH_BYTES - 1, 8 * 1024 * 1024])
def test_large_bodies_arrive_whole_to_a_slow_reader(size: int) -> None:
    """Past FLUSH_BYTES nothing is held; the real transport's flow control pauses the app."""
    payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    piece = 256 * 1024

    async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
        headers = [(b"content-length", str(size).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for at in range(0, size, piece):  # no await that yields in between: all in one step
            last = at + piece >= size
            await send(
                {
                    "type": "http.response.body",
                    "body": payload[at : at + piece],
                    "more_body": not last,
                }
            )

    async def main() -> None:
        async with serving(app) as (port, writes):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2**24)
            writer.write(b"GET /big HTTP/1.1\r\nhost: a\r\n\r\n")
            await asyncio.sleep(0.05)  # a slow reader: the server's buffer fills meanwhile
            _, got = await read_answer(reader)
            assert got == payload
            if size > FLUSH_BYTES:
                assert max(writes) < FLUSH_BYTES + piece + 1024  # never the whole body at once
            writer.close()

    asyncio.run(main())


def test_a_closing_connection_gets_its_answer_first() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
        headers = [(b"content-length", b"3")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"bye"})

    async def main() -> None:
        async with serving(app) as (port, writes):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /c HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
            everything = await asyncio.wait_for(reader.read(), 10)  # to EOF
            assert everything.startswith(b"HTTP/1.1 200 ")
            assert everything.endswith(b"\r\n\r\nbye")
            assert len(writes) == 1
            writer.close()

    asyncio.run(main())
