"""A bus for the platform tests: a private nats-server's topology, records and events written
as torpor's services write them (KV records, ``emit``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

from faststream.nats import NatsBroker

from shared.bus.broker import key_value, make_broker, prepare
from shared.bus.publishing import BrokerPublisher
from shared.bus.records import KvSandboxStore
from shared.bus.topology import KV_SANDBOXES
from shared.domain.record import SandboxRecord
from shared.domain.states import SandboxState
from shared.ports.bus import emit
from shared.settings import BusSettings


@dataclass
class Bus:
    broker: NatsBroker
    store: KvSandboxStore
    publisher: BrokerPublisher

    async def sandbox(self, sandbox_id: str, owner: str, *, template: str = "sandbox-base") -> None:
        now = datetime.now(UTC)
        await self.store.create(
            SandboxRecord(
                sandbox_id=sandbox_id,
                owner=owner,
                template=template,
                state=SandboxState.RUNNING,
                created_at=now,
                started_at=now,
                updated_at=now,
                envs={"SECRET_TOKEN": "s3cr3t-value"},
                envd_access_token="envd-token-never-shown",
            )
        )

    async def emit(self, *messages: object) -> None:
        for message in messages:
            await emit(self.publisher, message)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def bus(nats_url: str, *, service: str = "test") -> AsyncIterator[Bus]:
    settings = BusSettings(nats_url=nats_url)
    broker = make_broker(settings, service=service)
    await prepare(broker, settings)
    try:
        yield Bus(
            broker=broker,
            store=KvSandboxStore(await key_value(broker, KV_SANDBOXES)),
            publisher=BrokerPublisher(broker),
        )
    finally:
        await broker.stop()
