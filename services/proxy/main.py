"""``python -m services.proxy.main``: the sandbox proxy (uvicorn), configured from the
environment (``TORPOR_PROXY_*``, ``NATS_URL``)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
import uvicorn

from services.proxy.app import ProxyApp
from services.proxy.ports import ProxyWiring
from services.proxy.settings import ProxySettings
from shared.errors import ConfigError
from shared.logging import configure
from shared.quota.models import QuotaSettings
from shared.settings import BusSettings, LoggingSettings, load
from shared.web.limits import HttpLimits
from shared.web.serving import server_config


@asynccontextmanager
async def bus_wiring(bus: BusSettings, quotas: QuotaSettings) -> AsyncIterator[ProxyWiring]:
    from shared.auth.keys import KvApiKeys, KvUsers
    from shared.bus.broker import key_value, make_broker, prepare
    from shared.bus.kv import NatsBucket, NatsCasBucket
    from shared.bus.publishing import BrokerPublisher
    from shared.bus.record_cache import KvRecordCache
    from shared.bus.records import KvSandboxStore
    from shared.bus.topology import KV_API_KEYS, KV_RATES, KV_SANDBOXES, KV_USERS
    from shared.lifecycle.service import SandboxLifecycle
    from shared.quota.guard import QuotaGuard
    from shared.quota.rates import RateLimiter

    broker = make_broker(bus, service="proxy")
    await prepare(broker, bus)
    cache: KvRecordCache | None = None
    try:
        sandboxes = await key_value(broker, KV_SANDBOXES)
        cache = KvRecordCache(sandboxes)
        await cache.start()
        users = KvUsers(NatsBucket(await key_value(broker, KV_USERS)))
        keys = KvApiKeys(NatsBucket(await key_value(broker, KV_API_KEYS)), users)
        store = KvSandboxStore(sandboxes)
        lifecycle = SandboxLifecycle(store, BrokerPublisher(broker))
        quota = QuotaGuard(
            quotas,
            users=users,
            records=store,
            rates=RateLimiter(NatsCasBucket(await key_value(broker, KV_RATES))),
        )
        yield ProxyWiring(
            records=cache, lifecycle=lifecycle, keys=keys, admit_resume=quota.before_resume
        )
    finally:
        if cache is not None:
            await cache.stop()
        await broker.stop()


def build(
    settings: ProxySettings, bus: BusSettings, limits: HttpLimits, quotas: QuotaSettings
) -> ProxyApp:
    return ProxyApp(settings, connect=lambda: bus_wiring(bus, quotas), limits=limits)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torpor-proxy", description=__doc__)
    parser.add_argument("--host", help="listen address (TORPOR_PROXY_HOST)")
    parser.add_argument("--port", type=int, help="listen port (TORPOR_PROXY_PORT)")
    args = parser.parse_args(argv)
    try:
        settings = load(ProxySettings)
        bus = load(BusSettings)
        logging_settings = load(LoggingSettings)
        limits = load(HttpLimits)
        quotas = load(QuotaSettings)
    except ConfigError as e:
        print(f"torpor-proxy: {e}", file=sys.stderr)
        return 2
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if overrides:
        settings = settings.model_copy(update=overrides)
    configure(logging_settings, service="proxy")
    config = server_config(
        build(settings, bus, limits, quotas),
        limits,
        host=settings.host,
        port=settings.port,
        lifespan="on",
        ws="websockets-sansio",
        timeout_keep_alive=75,
        backlog=4096,
    )
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(config).run()
    structlog.get_logger().info("proxy_stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
