"""Serving an ASGI app on 127.0.0.1 from a background thread (uvicorn), for tests that need a
real socket: the e2b SDK, the proxy, upstream stand-ins."""

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
    port = port or free_port(host)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            lifespan=config.pop("lifespan", "on"),
            **config,
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            msg = "uvicorn did not start"
            raise RuntimeError(msg)
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
