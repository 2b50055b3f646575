"""``python -m services.proxy.main``: the sandbox proxy (uvicorn), configured from the
environment (``TORPOR_PROXY_*``, ``NATS_URL``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from services.proxy.app import ProxyApp
from services.proxy.ports import ProxyWiring
from services.proxy.settings import ProxySettings
from shared.quota.models import QuotaSettings
from shared.settings import BusSettings
from shared.web.limits import HttpLimits
from shared.web.serving import Sections, run_http_service


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


def build(settings: ProxySettings, sections: Sections) -> ProxyApp:
    bus, quotas = sections[BusSettings], sections[QuotaSettings]
    return ProxyApp(settings, connect=lambda: bus_wiring(bus, quotas), limits=sections[HttpLimits])


def main(argv: list[str] | None = None) -> int:
    return run_http_service(
        argv,
        service="proxy",
        description=__doc__,
        settings=ProxySettings,
        sections=(BusSettings, QuotaSettings),
        build=build,
        variables=("TORPOR_PROXY_HOST", "TORPOR_PROXY_PORT"),
        lifespan="on",
        ws="websockets-sansio",
        timeout_keep_alive=75,
        backlog=4096,
    )


if __name__ == "__main__":
    raise SystemExit(main())
