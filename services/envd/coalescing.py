"""uvicorn's httptools protocol writing each answer with one send instead of two.

Why: uvicorn writes a response's head when the app sends ``http.response.start`` and its body
when the app sends ``http.response.body``: two ``send`` syscalls, two TCP segments, and on the
other end (the proxy, or the client) two wake-ups and two reads for one answer. Here the writes
made within one event-loop step are joined and sent at the end of that step, so an answer the
app produces without waiting in between (every unary answer) leaves in one segment as soon as
it is complete, while a streamed answer still goes out as it is produced (a step later at
most: nothing waits for more data). A large write is never held: past ``FLUSH_BYTES`` the
pending bytes go at once, so uvicorn's flow control (``pause_writing`` from the real
transport) works as before.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

FLUSH_BYTES = 64 * 1024


class CoalescingTransport:
    """Wraps a transport: ``write`` collects, the end of the loop step (or a large amount, or
    closing) sends. Everything else is the real transport's."""

    __slots__ = ("_loop", "_pending", "_size", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] | None = None
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if self._pending is None:
            self._pending = [bytes(data)]
            self._size = len(data)
            self._loop.call_soon(self.flush)
        else:
            self._pending.append(bytes(data))
            self._size += len(data)
        if self._size >= FLUSH_BYTES:
            self.flush()

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pending, self._pending = self._pending, None
        self._size = 0
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._size

    def close(self) -> None:
        self.flush()  # uvicorn closes right after writing a last answer
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._pending = None
        self._size = 0
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's ``http=`` class: ``HttpToolsProtocol`` on a ``CoalescingTransport``."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]

    def on_response_complete(self) -> None:
        # The answer is whole: send it now, not at the end of the step (which still has the
        # app's return and uvicorn's bookkeeping to run first).
        cast(CoalescingTransport, self.transport).flush()
        super().on_response_complete()
