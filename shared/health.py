"""A tiny asyncio HTTP server for workers: ``/livez``, ``/readyz`` and ``/metrics``.

Workers (scheduler, snapshotter, scaler) have no web framework; this gives Kubernetes probes and
Prometheus something to call without pulling one in. ``/readyz`` asks a callback, which should
reflect the NATS connection (``broker.ping``), so a worker whose bus is gone is taken out of
rotation instead of silently idling.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from shared.errors import ConfigError

log = structlog.get_logger()

ReadyCheck = Callable[[], Awaitable[bool]]

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


async def always_ready() -> bool:
    return True


def inherited_listener(fd: int) -> socket.socket:
    """The listening TCP socket a supervisor handed down as file descriptor ``fd``
    (``TORPOR_HEALTH_FD``); ``ConfigError`` when ``fd`` is no such socket."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as e:
        msg = f"TORPOR_HEALTH_FD={fd}: not an open socket ({e.strerror})"
        raise ConfigError(msg) from e
    tcp = sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6)
    if not tcp or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.detach()  # not ours to close
        msg = f"TORPOR_HEALTH_FD={fd}: not a listening TCP socket"
        raise ConfigError(msg)
    sock.setblocking(False)
    return sock


class HealthServer:
    """``async with HealthServer(port=8080, ready=check): ...``; ``port=0`` picks a free port."""

    def __init__(
        self,
        *,
        host: str = "0.0.0.0",
        port: int = 0,
        ready: ReadyCheck = always_ready,
        registry: CollectorRegistry = REGISTRY,
        ready_timeout: float = 2.0,
        sock: socket.socket | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._sock = sock  # a listening socket to serve instead of binding host:port
        self._ready = ready
        self._registry = registry
        self._ready_timeout = ready_timeout
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The bound port (after ``start``)."""
        if self._server is None:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> HealthServer:
        if self._sock is not None:
            self._server = await asyncio.start_server(self._handle, sock=self._sock)
        else:
            self._server = await asyncio.start_server(self._handle, self._host, self._port)
        log.info("health_listening", host=self._host, port=self.port)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> HealthServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _is_ready(self) -> bool:
        try:
            return await asyncio.wait_for(self._ready(), self._ready_timeout)
        except Exception:
            return False

    async def _respond(self, method: str, path: str) -> tuple[int, bytes, str]:
        text = "text/plain; charset=utf-8"
        if method not in {"GET", "HEAD"}:
            return 405, b"method not allowed\n", text
        route = path.split("?", 1)[0]
        if route in {"/livez", "/healthz", "/health"}:
            return 200, b"ok\n", text
        if route == "/readyz":
            if await self._is_ready():
                return 200, b"ready\n", text
            return 503, b"not ready\n", text
        if route == "/metrics":
            return 200, generate_latest(self._registry), CONTENT_TYPE_LATEST
        return 404, b"not found\n", text

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), 5)
            # Drain the headers; probes send no body.
            while await asyncio.wait_for(reader.readline(), 5) not in (b"\r\n", b"\n", b""):
                pass
            parts = request_line.decode("latin-1").split()
            if len(parts) < 2:
                return
            method, path = parts[0], parts[1]
            status, body, content_type = await self._respond(method, path)
            head = (
                f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n"
                f"Content-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode("latin-1") + (b"" if method == "HEAD" else body))
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
