"""Per-request correlation id (bound into structlog and echoed back) and Prometheus metrics, as
one plain ASGI middleware so streaming bodies are not buffered."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CORRELATION_HEADER = "x-correlation-id"
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

log = structlog.get_logger()


class HttpMetrics:
    def __init__(self, registry: CollectorRegistry, *, prefix: str) -> None:
        self.requests = Counter(
            f"{prefix}_http_requests_total",
            "HTTP requests by route template, method and status",
            ["method", "route", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            f"{prefix}_http_request_duration_seconds",
            "HTTP request latency by route template",
            ["method", "route"],
            registry=registry,
        )


def correlation_id_from(headers: list[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name.lower() in (CORRELATION_HEADER.encode(), b"x-request-id"):
            candidate = value.decode("latin-1")
            if _SAFE_ID.match(candidate):
                return candidate
    return uuid.uuid4().hex


class RequestContext:
    def __init__(self, app: ASGIApp, metrics: HttpMetrics, *, access_log: bool = True) -> None:
        self.app = app
        self.metrics = metrics
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cid = correlation_id_from(scope.get("headers", []))
        started = time.perf_counter()
        status: dict[str, Any] = {"code": 500}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                headers = list(message.get("headers", []))
                headers.append((CORRELATION_HEADER.encode(), cid.encode()))
                message = {**message, "headers": headers}
            await send(message)

        with structlog.contextvars.bound_contextvars(correlation_id=cid):
            try:
                await self.app(scope, receive, send_with_id)
            finally:
                route = getattr(scope.get("route"), "path", None) or "unmatched"
                elapsed = time.perf_counter() - started
                method = scope["method"]
                self.metrics.requests.labels(method, route, str(status["code"])).inc()
                self.metrics.latency.labels(method, route).observe(elapsed)
                if self.access_log and route not in ("/health", "/metrics"):
                    # The path, never headers: API keys travel only in headers.
                    log.info(
                        "http_request",
                        method=method,
                        route=route,
                        status=status["code"],
                        ms=round(elapsed * 1000, 1),
                    )
