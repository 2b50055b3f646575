"""An ASGI app under uvicorn on 127.0.0.1 in a background thread, for tests that need a real
socket: the e2b SDK, the proxy, upstream stand-ins, the HTTP guard."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from shared.bus.server import free_port


@contextmanager
def serve(
    app: Any, *, host: str = "127.0.0.1", port: int | None = None, **config: Any
) -> Iterator[str]:
    """``app`` with uvicorn's defaults (no access log); yields its base URL."""
    port = port or free_port(host)
    lifespan = config.pop("lifespan", "on")
    with serve_config(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            lifespan=lifespan,
            **config,
        )
    ) as url:
        yield url


@contextmanager
def serve_config(config: uvicorn.Config) -> Iterator[str]:
    """A server of a prepared configuration (e.g. the production one); yields its base URL."""
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            msg = "uvicorn did not start"
            raise RuntimeError(msg)
        time.sleep(0.02)
    try:
        yield f"http://{config.host}:{config.port}"
    finally:
        server.should_exit = True
        thread.join(10)
