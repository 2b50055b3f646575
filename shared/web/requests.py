"""Request-level limits as small ASGI pieces: in-flight requests per client, and reading a
request body with a size cap and an idle deadline."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager

from starlette.types import Message, Receive, Scope, Send


class RequestRefused(Exception):
    def __init__(self, status: int, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


async def send_refusal(send: Send, refused: RequestRefused) -> None:
    body = json.dumps({"code": refused.status, "message": refused.message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if refused.retry_after is not None:
        headers.append((b"retry-after", str(refused.retry_after).encode()))
    await send({"type": "http.response.start", "status": refused.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "-"


class InFlight:
    """Requests in progress per client address (one process)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._counts: dict[str, int] = {}

    def acquire(self, scope: Scope) -> str:
        """Count one more request of this client (429 beyond the limit); pair with ``release``.
        Plain calls rather than a context manager: this runs on every proxied request."""
        client = scope.get("client")
        address = str(client[0]) if client else "-"
        count = self._counts.get(address, 0)
        if count >= self.limit:
            msg = f"more than {self.limit} requests in progress from this client"
            raise RequestRefused(429, msg, retry_after=1)
        self._counts[address] = count + 1
        return address

    def try_acquire(self, address: str) -> bool:
        """``acquire`` for callers without a scope: False (and nothing counted) at the limit."""
        count = self._counts.get(address, 0)
        if count >= self.limit:
            return False
        self._counts[address] = count + 1
        return True

    def release(self, address: str) -> None:
        left = self._counts[address] - 1
        if left:
            self._counts[address] = left
        else:
            del self._counts[address]

    @contextmanager
    def hold(self, scope: Scope) -> Iterator[None]:
        address = self.acquire(scope)
        try:
            yield
        finally:
            self.release(address)


def declared_length(scope: Scope) -> int | None:
    """Content-Length as declared (``None`` when absent or chunked); 400 when unreadable."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                raise RequestRefused(400, "invalid Content-Length") from None
            if length < 0:
                raise RequestRefused(400, "invalid Content-Length")
            return length
    return None


def has_body(scope: Scope) -> bool:
    length = declared_length(scope)
    if length is not None:
        return length > 0
    return any(name == b"transfer-encoding" for name, _ in scope.get("headers", []))


def too_large(limit: int) -> RequestRefused:
    return RequestRefused(413, f"request body larger than {limit} bytes")


def check_declared(scope: Scope, limit: int) -> None:
    length = declared_length(scope)
    if length is not None and length > limit:
        raise too_large(limit)


class BodyReader:
    """Wraps ``receive``: each body message must come within ``idle`` seconds and the total must
    stay within ``limit`` bytes (413 / 408 as ``RequestRefused``)."""

    def __init__(
        self, receive: Receive, *, limit: int, idle: float, total: float | None = None
    ) -> None:
        self._receive = receive
        self.limit = limit
        self.idle = idle
        self.total = total
        self._deadline = None if total is None else asyncio.get_running_loop().time() + total
        self.received = 0

    async def __call__(self) -> Message:
        wait = self.idle
        if self._deadline is not None:
            wait = min(wait, self._deadline - asyncio.get_running_loop().time())
        try:
            async with asyncio.timeout(max(wait, 0.0)):
                message = await self._receive()
        except TimeoutError:
            if wait < self.idle:
                msg = f"request body not received within {self.total:g}s"
            else:
                msg = f"request body stalled for more than {self.idle:g}s"
            raise RequestRefused(408, msg) from None
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                raise too_large(self.limit)
        return message

    async def read_all(self) -> tuple[bytes, bool]:
        """The whole body, and whether the client disconnected instead of finishing it."""
        parts: list[bytes] = []
        while True:
            message = await self()
            if message["type"] == "http.disconnect":
                return b"".join(parts), True
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(parts), False
