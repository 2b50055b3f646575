"""An idle stand-in for a service, for tests of what surrounds the services: ``torpor up``'s
supervisor, the bus's users and permissions, the open-bus warning.

A placeholder does what every torpor worker does at start-up — connect to NATS, converge the
topology, serve health — logs ``placeholder_ready`` and waits for SIGTERM. It binds no durable,
so a test can use the service users itself without competing with a real service.

- ``python -m tests.support.placeholder run <name>``: one placeholder, configured like
  ``torpor run <name>`` (``NATS_URL``, ``TORPOR_HEALTH_PORT``, ...).
- ``python -m tests.support.placeholder up [options of torpor up]``: ``torpor up`` itself, its
  supervisor pointed at placeholders instead of the services (``supervising.SERVICE_MODULE``, the
  product's one hook for this).
"""

from __future__ import annotations

import asyncio
import signal
import sys

import structlog

from services.cli import catalog
from shared.bus.broker import make_broker, prepare
from shared.health import HealthServer, inherited_listener
from shared.settings import BusSettings, HealthSettings, LoggingSettings, load

COMMAND = [sys.executable, "-m", "tests.support.placeholder"]
READY = "placeholder_ready"

log = structlog.get_logger()


async def serve(name: str, *, bus: BusSettings, health: HealthSettings) -> int:
    broker = make_broker(bus, service=name)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def ready() -> bool:
        return await broker.ping(timeout=1.0)

    sock = inherited_listener(health.health_fd) if health.health_fd is not None else None
    server = HealthServer(host=health.health_host, port=health.health_port, ready=ready, sock=sock)
    try:
        # Probes answer first (live, not ready) so a slow bus shows up as "not ready".
        await server.start()
        connecting = asyncio.create_task(prepare(broker, bus))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if connecting.done():
            connecting.result()
            log.info(READY, service=name)
            await stopping
        else:
            connecting.cancel()
        log.info("placeholder_stopping")
    finally:
        await server.stop()
        await broker.stop()
    return 0


def run(name: str) -> int:
    from shared.logging import configure

    if name not in catalog.NAMES:
        print(f"unknown service {name!r}", file=sys.stderr)
        return 2
    configure(load(LoggingSettings), service=name)
    return asyncio.run(serve(name, bus=load(BusSettings), health=load(HealthSettings)))


def up(argv: list[str]) -> int:
    from services.cli import main, supervising

    supervising.SERVICE_MODULE = "tests.support.placeholder"
    return main.main(["up", *argv])


if __name__ == "__main__":
    match sys.argv[1:]:
        case ["run", name]:
            raise SystemExit(run(name))
        case ["up", *rest]:
            raise SystemExit(up(rest))
        case _:
            print(__doc__, file=sys.stderr)
            raise SystemExit(2)
