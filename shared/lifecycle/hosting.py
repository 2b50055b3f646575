"""Running a lifecycle worker (snapshotter, scaler): broker, topology, router, health, SIGTERM.

``WorkerHost`` is the shared composition skeleton: each service's ``bootstrap`` gives it a
function that builds the service's router from the connected parts, so tests can run the very
same wiring in-process with fakes or real adapters.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from faststream.nats import NatsBroker, NatsRouter

from shared.bus.broker import key_value, make_broker, prepare
from shared.bus.publishing import BrokerPublisher
from shared.bus.records import KvSandboxStore
from shared.bus.topology import KV_SANDBOXES
from shared.settings import BusSettings

log = structlog.get_logger()


@dataclass(frozen=True)
class Parts:
    """What a worker's router is built from once the bus is up."""

    broker: NatsBroker
    store: KvSandboxStore
    publisher: BrokerPublisher


RouterFactory = Callable[[Parts], NatsRouter]


class WorkerHost:
    def __init__(self, *, service: str, bus: BusSettings, build: RouterFactory) -> None:
        self._service = service
        self._bus = bus
        self._build = build
        self.broker = make_broker(bus, service=service)

    async def start(self) -> Parts:
        await prepare(self.broker, self._bus)
        parts = Parts(
            broker=self.broker,
            store=KvSandboxStore(await key_value(self.broker, KV_SANDBOXES)),
            publisher=BrokerPublisher(self.broker),
        )
        self.broker.include_router(self._build(parts))
        await self.broker.start()
        log.info("worker_started", service=self._service)
        return parts

    async def ready(self) -> bool:
        return bool(await self.broker.ping(timeout=1.0))

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.broker.stop()


async def until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping")
