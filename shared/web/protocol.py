"""uvicorn's httptools protocol with the connection-level limits uvicorn lacks.

uvicorn bounds neither the size nor the count of request headers when httptools parses them
(llhttp buffers a header value of any size), and starts no timer on a connection until its
first response: a client trickling a request head holds a connection (and its memory) forever.
This subclass counts head bytes as they arrive, checks the header count when the head is
complete, arms a deadline from the first byte of each request head (and from the connection's
opening), and caps connections per process and per client address. Every refusal is a JSON
``{"code", "message"}`` response followed by closing the connection; nothing reaches the app.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import structlog
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from shared.web.limits import HttpLimits

log = structlog.get_logger()


def refusal(status: int, message: str, *, retry_after: int | None = None) -> bytes:
    body = json.dumps({"code": status, "message": message}).encode()
    head = [
        STATUS_LINE[status],
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(body),
        b"connection: close\r\n",
    ]
    if retry_after is not None:
        head.append(b"retry-after: %d\r\n" % retry_after)
    return b"".join([*head, b"\r\n", body])


class _PerClient:
    """Open connections per client address, for one server (kept on its ``ServerState``)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, address: str) -> int:
        self.counts[address] = self.counts.get(address, 0) + 1
        return self.counts[address]

    def remove(self, address: str) -> None:
        left = self.counts.get(address, 0) - 1
        if left > 0:
            self.counts[address] = left
        else:
            self.counts.pop(address, None)


def per_client_counts(server_state: ServerState) -> _PerClient:
    """The open connections per client address of one server (every protocol class serving it
    counts in the same place)."""
    per_client: _PerClient | None = getattr(server_state, "torpor_per_client", None)
    if per_client is None:
        per_client = _PerClient()
        server_state.torpor_per_client = per_client  # type: ignore[attr-defined]
    return per_client


def guarded_protocol(limits: HttpLimits) -> type[HttpToolsProtocol]:
    """The protocol class to hand uvicorn as ``http=`` (limits bound in)."""

    class GuardedHttpProtocol(HttpToolsProtocol):
        def __init__(
            self,
            config: Config,
            server_state: ServerState,
            app_state: dict[str, Any],
            _loop: asyncio.AbstractEventLoop | None = None,
        ) -> None:
            super().__init__(config, server_state, app_state, _loop)
            self._per_client = per_client_counts(server_state)
            self._counted: str | None = None
            self._in_head = True  # a new connection is waiting for its first request head
            self._head_bytes = 0  # of the current head, in chunks before the one being parsed
            self._chunk = 0  # size of the chunk being parsed
            self._head_timer: asyncio.TimerHandle | None = None
            self._refused = False

        # ---- connection ---------------------------------------------------------------------

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            address = self.client[0] if self.client else None
            if len(self.connections) > limits.max_connections:
                self._refuse(503, "too many open connections", retry_after=1)
                return
            if address and not limits.is_trusted(address):
                self._counted = address
                if self._per_client.add(address) > limits.max_connections_per_client:
                    self._refuse(503, "too many open connections from this client", retry_after=1)
                    return
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            if self._counted is not None:
                self._per_client.remove(self._counted)
                self._counted = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            self._chunk = len(data)
            super().data_received(data)
            if self._in_head and not self._refused:
                # The head did not fit in this chunk: count it, and give it a deadline (a head
                # that arrives whole, the usual case, costs no timer).
                self._head_bytes += self._chunk
                if self._head_bytes > limits.max_header_bytes:
                    msg = f"request headers larger than {limits.max_header_bytes} bytes"
                    self._refuse(431, msg)
                elif self._head_timer is None:
                    self._arm_head_timer()

        def handle_websocket_upgrade(self) -> None:
            # The transport moves to the WebSocket protocol, which will not call our
            # connection_lost: stop counting the connection here.
            self._cancel_head_timer()
            if self._counted is not None:
                self._per_client.remove(self._counted)
                self._counted = None
            super().handle_websocket_upgrade()

        # ---- parser callbacks ---------------------------------------------------------------

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if not self._in_head:  # the next request on a kept-alive connection
                self._in_head = True
                self._head_bytes = 0

        def on_headers_complete(self) -> None:
            self._in_head = False
            if self._head_timer is not None:
                self._cancel_head_timer()
            if len(self.headers) > limits.max_headers:
                self._refuse(431, f"more than {limits.max_headers} request headers")
                return
            # Exact size only when the bytes seen could exceed the limit (cheap otherwise).
            if self._head_bytes + self._chunk > limits.max_header_bytes:
                size = len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers)
                if size > limits.max_header_bytes:
                    msg = f"request headers larger than {limits.max_header_bytes} bytes"
                    self._refuse(431, msg)
                    return
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if not self._refused:
                super().on_message_complete()

        # ---- refusals -----------------------------------------------------------------------

        def send_400_response(self, msg: str) -> None:
            self._refuse(400, msg)  # a malformed request: JSON like every other refusal

        def _arm_head_timer(self) -> None:
            self._cancel_head_timer()
            self._head_timer = self.loop.call_later(limits.header_timeout, self._head_too_slow)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_too_slow(self) -> None:
            self._head_timer = None
            if not self._in_head or self._refused:
                return
            self._refuse(408, f"request head not received within {limits.header_timeout:g}s")

        def _refuse(self, status: int, message: str, *, retry_after: int | None = None) -> None:
            self._refused = True
            self._cancel_head_timer()
            log.info("http_refused", status=status, reason=message)
            if not self.transport.is_closing():
                self.transport.write(refusal(status, message, retry_after=retry_after))
                self.transport.close()

    return GuardedHttpProtocol
