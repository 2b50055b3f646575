"""The uvicorn configuration both public services run with (and the benchmark measures)."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, runtime_checkable

import uvicorn

from shared.web.limits import HttpLimits
from shared.web.protocol import guarded_protocol


@runtime_checkable
class ServesItsOwnProtocol(Protocol):
    """An app that brings its connection protocol (built on the guarded one), e.g. the proxy's
    fast path."""

    def http_protocol(self, limits: HttpLimits) -> type[asyncio.Protocol]: ...


def server_config(
    app: Any, limits: HttpLimits, *, host: str, port: int, **extra: Any
) -> uvicorn.Config:
    """``uvicorn.Config`` with the guarded protocol. X-Forwarded-For/-Proto rewrite the client
    address and scheme only for connections from ``TORPOR_HTTP_TRUSTED_PROXIES``; without any,
    forwarded headers are ignored (uvicorn would otherwise trust 127.0.0.1 by default)."""
    trusted = [str(n) for n in limits.trusted_networks]
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=(
            app.http_protocol(limits)
            if isinstance(app, ServesItsOwnProtocol)
            else guarded_protocol(limits)
        ),
        proxy_headers=bool(trusted),
        forwarded_allow_ips=trusted or None,
        log_config=None,
        access_log=False,
        **extra,
    )
