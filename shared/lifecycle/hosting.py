"""One host for every worker (snapshotter, scaler, scheduler, and whatever service comes next).

``WorkerHost`` owns the broker: it connects, converges the topology, gives the service's
``build`` function the connected parts (the record store and the publisher, as ports; the broker
for adapters such as the scheduler's timers), includes the router it returns, and starts
consuming. ``shared.lifecycle.entry.run_worker`` adds settings, logging, health, the runtime and
the shutdown on SIGTERM. A service is thus ``main`` (a ``WorkerSpec``) + ``bootstrap`` (ports in,
router out) + handlers + its decisions; tests run the very same ``build`` in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import structlog
from faststream.nats import NatsBroker, NatsRouter
from prometheus_client import CollectorRegistry

from shared.bus.broker import key_value, make_broker, prepare
from shared.bus.publishing import BrokerPublisher
from shared.bus.records import KvSandboxStore
from shared.bus.retry import RetryPolicy
from shared.bus.topology import KV_SANDBOXES, Durable
from shared.models.lifecycle import TemplateFacts
from shared.ports.bus import Publisher, SandboxStore
from shared.ports.envd import Envd
from shared.ports.runtime import Runtime
from shared.runtime.template_facts import read_facts
from shared.settings import BusSettings, FeatureFlags, RetentionSettings, RuntimeSettings, load

log = structlog.get_logger()


@dataclass(frozen=True)
class Parts:
    """What a worker's router is built from once the bus is up."""

    broker: NatsBroker
    store: SandboxStore
    publisher: Publisher


class Background(Protocol):
    """A consumer of its own next to the router (``shared.bus.batches.BatchConsumer``)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class Built:
    """What ``build`` may return instead of a bare router: the router plus consumers of its own,
    started after the broker and stopped before it."""

    router: NatsRouter
    background: tuple[Background, ...] = ()


RouterFactory = Callable[[Parts], NatsRouter | Built]


@dataclass(frozen=True)
class Context:
    """What a worker's host is made from: the shared settings sections, and the runtime and the
    daemon client if its ``WorkerSpec`` asks for them."""

    bus: BusSettings
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    flags: FeatureFlags = field(default_factory=FeatureFlags)
    runtime: Runtime | None = None
    envd: Envd | None = None
    # The process's one metrics registry, served on /metrics; services make their metrics on it
    # (a fresh one by default, so hosts built side by side in one process count apart).
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def pods(self) -> tuple[Runtime, Envd]:
        if self.runtime is None or self.envd is None:
            msg = "this worker was declared without a runtime (WorkerSpec.runtime)"
            raise RuntimeError(msg)
        return self.runtime, self.envd


def template_facts() -> Callable[[str], TemplateFacts]:
    """What a template says about a sandbox's lifecycle, read from the configured runtime (its
    settings already read, and checked, for the runtime itself)."""
    where = load(RuntimeSettings)
    return partial(read_facts, where.runtime, where.templates_dir)


class RetrySettings(Protocol):
    """A service's settings for its long handlers (``TORPOR_<SERVICE>_*``)."""

    @property
    def give_up_after(self) -> int: ...

    @property
    def heartbeat_seconds(self) -> float: ...


def tuned_retry(durable: Durable, settings: RetrySettings) -> RetryPolicy:
    """The durable's retry policy with the service's give-up count and heartbeat interval."""
    return durable.retry.tuned(
        give_up_after=settings.give_up_after, heartbeat=settings.heartbeat_seconds
    )


class WorkerHost:
    def __init__(self, *, service: str, bus: BusSettings, build: RouterFactory) -> None:
        self.service = service
        self._bus = bus
        self._build = build
        self.broker = make_broker(bus, service=service)
        self._background: tuple[Background, ...] = ()
        self._started = False

    async def start(self) -> Parts:
        await prepare(self.broker, self._bus)
        parts = Parts(
            broker=self.broker,
            store=KvSandboxStore(await key_value(self.broker, KV_SANDBOXES)),
            publisher=BrokerPublisher(self.broker),
        )
        built = self._build(parts)
        if not isinstance(built, Built):
            built = Built(built)
        self.broker.include_router(built.router)
        await self.broker.start()
        for consumer in built.background:
            await consumer.start()
        self._background = built.background
        self._started = True
        log.info("worker_started", service=self.service)
        return parts

    async def ready(self) -> bool:
        """Consuming (not merely connected: a replica that is not pulling yet takes no work)."""
        return self._started and bool(await self.broker.ping(timeout=1.0))

    async def stop(self) -> None:
        """In-flight messages finish (the broker's graceful timeout); the rest stay queued."""
        for consumer in self._background:
            with contextlib.suppress(Exception):
                await consumer.stop()
        with contextlib.suppress(Exception):
            await self.broker.stop()


async def until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping")
