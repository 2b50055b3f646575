"""Run the daemon's ASGI app under uvicorn (HTTP/1.1, chunked bodies) on a pre-bound socket."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import logging
import socket
import sys
from typing import TYPE_CHECKING

from services.envd.app import EnvdApp
from services.envd.startup import Readiness, Startup
from services.envd.startup import run as run_startup
from services.envd.version import ENVD_VERSION

if TYPE_CHECKING:
    from types import FrameType

    from uvicorn.server import Server


def _lean_uvicorn() -> None:
    """Register the ``uvicorn`` package without running its ``__init__``, which imports
    ``uvicorn.main`` and with it click and the reload supervisors: about a third of uvicorn's
    import time, and nothing the daemon uses (it needs only ``Config``, ``Server`` and the
    httptools protocol, imported below as submodules)."""
    if "uvicorn" in sys.modules:
        return
    spec = importlib.util.find_spec("uvicorn")
    if spec is None or spec.submodule_search_locations is None:
        return  # let the plain import below fail with its usual message
    sys.modules["uvicorn"] = importlib.util.module_from_spec(spec)


def _server(app: EnvdApp, log_level: str) -> Server:
    _lean_uvicorn()
    import uvicorn
    from uvicorn.config import Config
    from uvicorn.server import Server

    from services.envd.coalescing import CoalescingHttpToolsProtocol

    class _Server(Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # Runs in the signal handler, before the loop sees the SIGCHLDs of the processes
            # the pod's stop also signalled: their streams must break, not report an end.
            app.table.closing = True
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().call_soon_threadsafe(app.begin_shutdown)
            super().handle_exit(sig, frame)

    # What uvicorn's own modules import from the package (``uvicorn.lifespan.off``: Config).
    uvicorn.Config = Config  # type: ignore[misc]
    uvicorn.Server = Server  # type: ignore[misc]
    config = Config(
        app,
        lifespan="off",
        http=CoalescingHttpToolsProtocol,  # httptools, each answer in one send
        ws="none",
        loop="asyncio",
        interface="asgi3",
        log_config=None,  # logging.basicConfig below; dictConfig costs an import and a parse
        log_level=log_level,
        access_log=False,
        # Streams (a watched dir, a followed process) would hold shutdown forever.
        timeout_graceful_shutdown=1,
        timeout_keep_alive=75,
    )
    return _Server(config)


def serve(
    sock: socket.socket,
    *,
    root: str,
    access_token: str | None,
    log_level: str,
    sudo_socket: str | None = None,
    startup: Startup | None = None,
    kept_root: str = "/",
) -> int:
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s envd %(levelname)s %(name)s: %(message)s"
    )
    app = EnvdApp(root=root, access_token=access_token, kept_root=kept_root)
    # Ready means the API can be served: load the Connect services (connectrpc and the protobuf
    # runtime, most of the start-up) before the server answers /health, so a resume's replay
    # right after "ready" does not pay for them, and pod start measures the whole start.
    _ = app.connect_apps
    server = _server(app, log_level)
    server.config.load()  # uvicorn's protocol classes, also before /health answers
    # Start-up ran without the cyclic GC (main() turned it off: imports create no garbage worth
    # collecting); what they built lives as long as the daemon, so keep it out of later passes.
    gc.freeze()
    gc.enable()

    # The sandbox's log (GET /logs) keeps the daemon's info records whatever stderr shows.
    for handler in logging.getLogger().handlers:
        handler.setLevel(log_level.upper())
    envd_log = logging.getLogger("envd")
    envd_log.setLevel(min(logging.INFO, logging.getLevelName(log_level.upper())))
    envd_log.addHandler(app.logs)

    async def run() -> None:
        app.table.install(asyncio.get_running_loop())
        envd_log.info("envd %s listening on %s, root %s", ENVD_VERSION, sock.getsockname(), root)
        sampler = asyncio.create_task(app.metrics.run())
        activity = asyncio.create_task(app.activity.run())
        starting = None
        if startup is not None:
            app.ready = Readiness()
            starting = asyncio.create_task(run_startup(startup, app.table, app.users, app.ready))
        sudo = None
        if sudo_socket:
            from services.envd.sudo import SudoServer

            sudo = SudoServer(sudo_socket, users=app.users, table=app.table)
            await sudo.start()
        try:
            await server.serve(sockets=[sock])
        finally:
            sampler.cancel()
            activity.cancel()
            if starting is not None:
                starting.cancel()
            if sudo is not None:
                await sudo.close()
            app.close()

    asyncio.run(run())
    return 0
