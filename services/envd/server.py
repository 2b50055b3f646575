"""Run the daemon's ASGI app under uvicorn (HTTP/1.1, chunked bodies) on a pre-bound socket."""

from __future__ import annotations

import asyncio
import logging
import socket

import uvicorn

from services.envd.app import EnvdApp
from services.envd.version import ENVD_VERSION


def serve(sock: socket.socket, *, root: str, access_token: str | None, log_level: str) -> int:
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s envd %(levelname)s %(name)s: %(message)s"
    )
    app = EnvdApp(root=root, access_token=access_token)
    config = uvicorn.Config(
        app,
        lifespan="off",
        http="httptools",
        ws="none",
        loop="asyncio",
        interface="asgi3",
        log_level=log_level,
        access_log=False,
        # Streams (a watched dir, a followed process) would hold shutdown forever.
        timeout_graceful_shutdown=1,
        timeout_keep_alive=75,
    )
    server = uvicorn.Server(config)

    async def run() -> None:
        app.table.install(asyncio.get_running_loop())
        logging.getLogger("envd").info(
            "envd %s listening on %s, root %s", ENVD_VERSION, sock.getsockname(), root
        )
        try:
            await server.serve(sockets=[sock])
        finally:
            app.close()

    asyncio.run(run())
    return 0
