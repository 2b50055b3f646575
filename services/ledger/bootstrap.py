"""Composition root of the ledger: the usage KV and the sizes in, a worker out."""

from __future__ import annotations

from faststream.nats import NatsRouter

from services.ledger.handlers import build_router
from services.ledger.metering import Ledger
from services.ledger.settings import LedgerSettings
from shared.bus.kv import LazyBucket
from shared.bus.topology import KV_USAGE
from shared.bus.usage import KvUsageStore
from shared.lifecycle.hosting import Context, Parts, WorkerHost
from shared.models.usage import MIB, Size


def size_of(settings: LedgerSettings) -> Size:
    return Size(
        cpu=settings.cpu_count, memory_mb=settings.memory_mb, kept_bytes=settings.kept_mb * MIB
    )


def ledger_host(ctx: Context, settings: LedgerSettings) -> WorkerHost:
    def build(parts: Parts) -> NatsRouter:
        js = parts.broker.config.connection_state.stream
        ledger = Ledger(
            records=parts.store,
            usage=KvUsageStore(LazyBucket(js, KV_USAGE)),
            size=size_of(settings),
        )
        return build_router(ledger)

    return WorkerHost(service="ledger", bus=ctx.bus, build=build)
