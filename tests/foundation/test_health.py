"""The workers' health server: liveness, readiness from a callback, Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from services.cli.probing import http_status
from shared.health import HealthServer


async def test_health_endpoints() -> None:
    ready = False

    async def check() -> bool:
        return ready

    registry = CollectorRegistry()
    Counter("torpor_test_things", "things", registry=registry).inc(3)
    async with HealthServer(host="127.0.0.1", port=0, ready=check, registry=registry) as server:
        assert await http_status("127.0.0.1", server.port, "/livez") == 200
        assert await http_status("127.0.0.1", server.port, "/readyz") == 503
        ready = True
        assert await http_status("127.0.0.1", server.port, "/readyz") == 200
        assert await http_status("127.0.0.1", server.port, "/nope") == 404
        import asyncio

        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        body = await reader.read()
        writer.close()
        assert b"torpor_test_things_total 3.0" in body


async def test_failing_readiness_callback_means_not_ready() -> None:
    async def broken() -> bool:
        raise ConnectionError("bus gone")

    async with HealthServer(host="127.0.0.1", port=0, ready=broken) as server:
        assert await http_status("127.0.0.1", server.port, "/readyz") == 503
        assert await http_status("127.0.0.1", server.port, "/livez") == 200
