"""The one boot path of the HTTP services (api, proxy: ``run_http_service``) and the uvicorn
configuration they run with (and the benchmark measures)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

import structlog
import uvicorn
from pydantic_settings import BaseSettings

from shared.errors import ConfigError
from shared.logging import configure
from shared.settings import LoggingSettings, load
from shared.web.limits import HttpLimits
from shared.web.protocol import guarded_protocol

T = TypeVar("T", bound=BaseSettings)
S = TypeVar("S", bound=BaseSettings)


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


class Sections:
    """The settings sections a service loaded at start, by class (``sections[HttpLimits]``)."""

    def __init__(self, loaded: dict[type[BaseSettings], BaseSettings]) -> None:
        self._loaded = loaded

    def __getitem__(self, cls: type[T]) -> T:
        value = self._loaded[cls]
        if not isinstance(value, cls):  # pragma: no cover - the dict is built by class
            raise TypeError(cls.__name__)
        return value


def run_http_service(
    argv: list[str] | None,
    *,
    service: str,
    description: str | None,
    settings: type[S],
    sections: tuple[type[BaseSettings], ...],
    build: Callable[[S, Sections], Any],
    variables: tuple[str, str],
    **uvicorn_extra: Any,
) -> int:
    """``torpor-<service> [--host H] [--port P]``: load the service's settings (flags win over
    ``variables``, its host and port variables) and ``sections`` besides logging and the HTTP
    limits, configure logging, serve ``build(settings, sections)`` until interrupted. A bad
    value is one line on stderr and exit code 2."""
    parser = argparse.ArgumentParser(prog=f"torpor-{service}", description=description)
    parser.add_argument("--host", help=f"listen address ({variables[0]})")
    parser.add_argument("--port", type=int, help=f"listen port ({variables[1]})")
    args = parser.parse_args(argv)
    flags = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    wanted: tuple[type[BaseSettings], ...] = (LoggingSettings, HttpLimits, *sections)
    try:
        own = load(settings, **flags)
        loaded = Sections({cls: load(cls) for cls in wanted})
    except ConfigError as e:
        print(f"torpor-{service}: {e}", file=sys.stderr)
        return 2
    configure(loaded[LoggingSettings], service=service)
    where = own.model_dump(include={"host", "port"})
    config = server_config(
        build(own, loaded),
        loaded[HttpLimits],
        host=where["host"],
        port=where["port"],
        **uvicorn_extra,
    )
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(config).run()
    structlog.get_logger().info(f"{service}_stopped")
    return 0
