"""The snapshotter and the scaler wired in memory: their real routers (and the bus middlewares)
on FastStream's ``TestNatsBroker``, the in-memory record store, and a recording publisher that
delivers what it stores to the routers like JetStream would.

The unit-tier twin of ``tests/lifecycle/harness.py`` (which runs the same routers on a real
nats-server). One delivery per message: a handler that fails is not redelivered here (the retry
and give-up paths across deliveries are covered by the integration tier).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from faststream.nats import TestNatsBroker

from services.scaler.handlers import build_router as scaler_router
from services.scaler.scaling import Scaler
from services.snapshotter.handlers import build_router as snapshotter_router
from services.snapshotter.pausing import Snapshotter
from shared.bus.broker import make_broker
from shared.bus.middleware import MSG_ID_HEADER
from shared.bus.retry import RetryPolicy
from shared.lifecycle.service import SandboxLifecycle
from shared.models.lifecycle import TemplateFacts, unknown_template
from shared.settings import BusSettings
from tests.fakes.publisher import Published, RecordingPublisher
from tests.fakes.runtime import FakeEnvd, FakeRuntime
from tests.fakes.store import InMemorySandboxStore


@dataclass
class InMemorySystem:
    lifecycle: SandboxLifecycle
    store: InMemorySandboxStore
    publisher: RecordingPublisher
    runtime: FakeRuntime
    envd: FakeEnvd


@contextlib.asynccontextmanager
async def in_memory_system(
    *,
    give_up_after: int = 3,
    templates: Callable[[str], TemplateFacts] = unknown_template,
    hold: float = 0.0,
) -> AsyncIterator[InMemorySystem]:
    store = InMemorySandboxStore()
    publisher = RecordingPublisher()
    runtime, envd = FakeRuntime(), FakeEnvd()
    snapshotter = Snapshotter(
        store=store,
        runtime=runtime,
        envd=envd,
        publisher=publisher,
        envd_timeout=5,
        templates=templates,
        hold=hold,
    )
    scaler = Scaler(
        store=store,
        runtime=runtime,
        envd=envd,
        publisher=publisher,
        ready_timeout=5,
        stop_timeout=5,
        templates=templates,
    )
    broker = make_broker(BusSettings(), service="unit")  # never connected: TestNatsBroker
    retry = RetryPolicy(give_up_after=give_up_after)
    broker.include_router(snapshotter_router(snapshotter, retry=retry))
    broker.include_router(scaler_router(scaler, retry=retry))
    async with TestNatsBroker(broker) as bus:

        async def deliver(out: Published) -> Any:
            body = out.message.model_dump(mode="json")
            return await bus.publish(body, out.subject, headers={MSG_ID_HEADER: out.msg_id})

        publisher.deliver = deliver
        try:
            yield InMemorySystem(
                lifecycle=SandboxLifecycle(store, publisher),
                store=store,
                publisher=publisher,
                runtime=runtime,
                envd=envd,
            )
        finally:
            await publisher.drain()
