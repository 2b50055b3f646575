"""An idle stand-in for a service that is not written yet.

It does what every torpor worker does at start-up — connect to NATS, converge the topology, serve
health — and then waits for SIGTERM, so ``torpor up`` and probes behave as they will later.
"""

from __future__ import annotations

import asyncio
import signal

import structlog

from shared.bus.broker import make_broker, prepare
from shared.health import HealthServer
from shared.settings import BusSettings, HealthSettings

log = structlog.get_logger()


async def serve(name: str, *, bus: BusSettings, health: HealthSettings) -> int:
    broker = make_broker(bus, service=name)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def ready() -> bool:
        return await broker.ping(timeout=1.0)

    server = HealthServer(host=health.health_host, port=health.health_port, ready=ready)
    try:
        # Probes answer first (live, not ready) so a slow bus shows up as "not ready".
        await server.start()
        connecting = asyncio.create_task(prepare(broker, bus))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if connecting.done():
            connecting.result()
            log.info("placeholder_ready", detail=f"services/{name}/main.py does not exist yet")
            await stopping
        else:
            connecting.cancel()
        log.info("placeholder_stopping")
    finally:
        await server.stop()
        await broker.stop()
    return 0
