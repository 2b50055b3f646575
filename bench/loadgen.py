"""A lean HTTP/1.1 load generator for the throughput benchmarks (proxy, daemon).

Why not httpx: at concurrency 32 its pool bookkeeping costs more CPU per request than the
servers being measured, and on 2 shared cores the client's CPU comes out of theirs, so the
benchmark measured mostly itself. Here each worker owns one keep-alive connection, sends a
pre-built request and parses the response with httptools (what uvicorn parses with). Every
response must be 2xx, or the run fails. Loopback only; bounded by the request count.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools


@dataclass(frozen=True)
class Result:
    p50_ms: float
    p99_ms: float
    rps: float
    requests: int

    def as_dict(self) -> dict[str, float]:
        return {"p50_ms": self.p50_ms, "p99_ms": self.p99_ms, "rps": self.rps}


def build_request(
    url: str, *, method: str = "GET", headers: dict[str, str] | None = None, body: bytes = b""
) -> tuple[str, int, bytes]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    lines = [f"{method} {path} HTTP/1.1", f"host: {host}:{port}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"content-length: {len(body)}")
    return host, port, ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._done: asyncio.Future[int] | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_message_complete(self) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(self._parser.get_status_code())

    def connection_lost(self, exc: Exception | None) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(ConnectionError(f"connection lost: {exc!r}"))
        if not self.lost.done():
            self.lost.set_result(None)

    async def request(self, raw: bytes) -> int:
        assert self.transport is not None
        self._done = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return await self._done


async def _run(host: str, port: int, raw: bytes, n: int, concurrency: int, warmup: int) -> Result:
    loop = asyncio.get_running_loop()
    conns = [(await loop.create_connection(_Conn, host, port))[1] for _ in range(concurrency)]
    try:
        for i in range(warmup):
            status = await conns[i % concurrency].request(raw)
            if not 200 <= status < 300:
                raise RuntimeError(f"{host}:{port}: HTTP {status} during warm-up")
        latencies: list[float] = []
        todo = iter(range(n))

        async def worker(conn: _Conn) -> None:
            for _ in todo:
                t = time.perf_counter()
                status = await conn.request(raw)
                latencies.append(time.perf_counter() - t)
                if not 200 <= status < 300:
                    raise RuntimeError(f"{host}:{port}: HTTP {status}")

        started = time.perf_counter()
        await asyncio.gather(*(worker(c) for c in conns))
        elapsed = time.perf_counter() - started
    finally:
        for conn in conns:
            if conn.transport is not None:
                conn.transport.close()
    latencies.sort()
    return Result(
        p50_ms=statistics.median(latencies) * 1000,
        p99_ms=latencies[max(0, int(len(latencies) * 0.99) - 1)] * 1000,
        rps=n / elapsed,
        requests=n,
    )


def drive(
    url: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    n: int,
    concurrency: int,
    warmup: int = 50,
) -> Result:
    """``n`` requests over ``concurrency`` keep-alive connections (uvloop when installed)."""
    host, port, raw = build_request(url, method=method, headers=headers, body=body)
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_run(host, port, raw, n, concurrency, warmup))
