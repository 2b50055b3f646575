"""Composition root of the ledger: the usage KV and the templates' sizes in, a worker out."""

from __future__ import annotations

from functools import partial

from faststream.nats import NatsRouter

from services.ledger.handlers import build_router
from services.ledger.metering import Ledger
from services.ledger.metrics import LedgerMetrics
from services.ledger.settings import LedgerSettings
from services.ledger.sizes import TemplateSizes
from shared.bus.kv import LazyBucket
from shared.bus.topology import KV_USAGE
from shared.bus.usage import KvUsageStore
from shared.lifecycle.hosting import Context, Parts, WorkerHost
from shared.models.template_records import BUILT_TEMPLATES_DIR
from shared.models.usage import MIB, Size
from shared.runtime.template_sizes import read_size
from shared.settings import RuntimeSettings, load


def size_of(settings: LedgerSettings) -> Size:
    return Size(
        cpu=settings.cpu_count, memory_mb=settings.memory_mb, kept_bytes=settings.kept_mb * MIB
    )


def ledger_host(ctx: Context, settings: LedgerSettings) -> WorkerHost:
    # The same templates the runtime reads (local: also those users built, by build id).
    where = load(RuntimeSettings)
    built = where.data_dir / BUILT_TEMPLATES_DIR if where.runtime == "local" else None
    sizes = TemplateSizes(
        partial(read_size, where.runtime, where.templates_dir, built), size_of(settings)
    )

    metrics = LedgerMetrics(ctx.registry)  # once per host: its builds share it

    def build(parts: Parts) -> NatsRouter:
        js = parts.broker.config.connection_state.stream
        ledger = Ledger(
            records=parts.store,
            usage=KvUsageStore(LazyBucket(js, KV_USAGE)),
            sizes=sizes,
            metrics=metrics,
        )
        return build_router(ledger)

    return WorkerHost(service="ledger", bus=ctx.bus, build=build)
