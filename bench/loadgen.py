"""A lean HTTP/1.1 load generator for the throughput benchmarks (proxy, daemon).

Why not httpx: at concurrency 32 its pool bookkeeping costs more CPU per request than the
servers being measured, and on 2 shared cores the client's CPU comes out of theirs, so the
benchmark measured mostly itself. Here each worker owns one keep-alive connection, sends a
pre-built request and parses the response with httptools (what uvicorn parses with). Every
response must be 2xx, or the run fails. Loopback only; bounded by the request count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
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


async def _run(
    host: str,
    port: int,
    raw: bytes,
    n: int,
    concurrency: int,
    warmup: int,
    ready: Callable[[], Awaitable[None]] | None = None,
) -> Result:
    loop = asyncio.get_running_loop()
    conns = [(await loop.create_connection(_Conn, host, port))[1] for _ in range(concurrency)]
    try:
        for i in range(warmup):
            status = await conns[i % concurrency].request(raw)
            if not 200 <= status < 300:
                raise RuntimeError(f"{host}:{port}: HTTP {status} during warm-up")
        if ready is not None:
            await ready()
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


@dataclass(frozen=True)
class ProcessesResult:
    rps: float
    p50_ms: float  # the median of the processes' p50s
    client_cpu_us_per_req: float  # all client processes, warm-up included


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drive_in_processes(
    url: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    n: int,
    concurrency: int,
    processes: int = 1,
    warmup: int = 50,
) -> ProcessesResult:
    """``drive`` split over ``processes`` client processes (connections and requests shared
    out), started together once every process has warmed up its connections."""
    processes = max(1, min(processes, concurrency))
    spec = {"url": url, "method": method, "headers": headers or {}, "body": body.hex()}
    procs = []
    for i in range(processes):
        share = {
            **spec,
            "n": n // processes + (1 if i < n % processes else 0),
            "concurrency": concurrency // processes + (1 if i < concurrency % processes else 0),
            "warmup": warmup,
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "--serve", json.dumps(share)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    try:
        for proc in procs:  # each says "ready" after its warm-up
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a load generator process failed before starting")
        cpu = [_cpu_seconds(p.pid) for p in procs]
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        started = time.perf_counter()
        results = []
        used = 0.0
        for proc, before in zip(procs, cpu, strict=True):
            assert proc.stdout is not None
            line = proc.stdout.readline()
            used += _cpu_seconds(proc.pid) - before
            if not line:
                raise RuntimeError("a load generator process failed")
            results.append(json.loads(line))
        elapsed = time.perf_counter() - started
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return ProcessesResult(
        rps=n / elapsed,
        p50_ms=statistics.median(r["p50_ms"] for r in results),
        client_cpu_us_per_req=used * 1e6 / n,
    )


def _serve(spec: dict[str, object]) -> None:
    """One process of ``drive_in_processes``: warm up, say ready, wait for go, run, report."""
    headers = spec["headers"]
    assert isinstance(headers, dict)
    host, port, raw = build_request(
        str(spec["url"]),
        method=str(spec["method"]),
        headers=headers,
        body=bytes.fromhex(str(spec["body"])),
    )

    async def ready() -> None:
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

    import uvloop

    n, concurrency, warmup = (int(str(spec[k])) for k in ("n", "concurrency", "warmup"))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        result = runner.run(_run(host, port, raw, n, concurrency, warmup, ready))
    print(json.dumps(result.as_dict()), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve", required=True, help=argparse.SUPPRESS)
    _serve(json.loads(parser.parse_args().serve))
