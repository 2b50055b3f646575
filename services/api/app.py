"""The API's app factory. ``create_app(settings, wiring=...)`` for tests (fakes or real parts);
``create_app(settings, bus=...)`` for the service, wiring NATS in the lifespan."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import structlog
from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from services.api import errors
from services.api.dashboard import dashboard_router
from services.api.deps import Wiring
from services.api.gate import ApiGate
from services.api.observability import HttpMetrics, RequestContext
from services.api.routes import (
    admin,
    e2b,
    events,
    native,
    snapshots,
    telemetry,
    templates,
    usage,
    webhooks,
)
from services.api.sessions import Sessions
from services.api.settings import ApiSettings
from services.api.template_builds import TemplateBuilds, TemplateStore
from shared.models.template_records import TEMPLATE_FILES_DIR
from shared.ports.bus import Publisher
from shared.quota.models import QuotaSettings
from shared.settings import BusSettings
from shared.web.limits import HttpLimits

log = structlog.get_logger()

DESCRIPTION = """\
torpor's control-plane API.

* **E2B-compatible** (`/sandboxes…`, `/v2/sandboxes…`): what the unmodified `e2b` SDK calls.
  Authenticate with `X-API-KEY`. Errors are `{"code": <int>, "message": "…"}`.
* **Native** (`/api/v1/sandbox…`): create, get, list, delete, pause and resume, with
  `Authorization: Bearer <api-key>`. Pause and resume are always available, whatever the
  `PAUSE_RESUME` flag says.
"""


@asynccontextmanager
async def bus_wiring(
    settings: ApiSettings, bus: BusSettings, quotas: QuotaSettings
) -> AsyncIterator[Wiring]:
    """Connect to NATS and build the lifecycle service and key store over it."""
    from shared.auth.keys import KvApiKeys, KvUsers
    from shared.bus.broker import key_value, make_broker, prepare
    from shared.bus.event_log import NatsEventLog
    from shared.bus.kv import NatsBucket, NatsCasBucket
    from shared.bus.publishing import BrokerPublisher
    from shared.bus.records import KvSandboxStore
    from shared.bus.snapshot_store import KvSnapshotStore
    from shared.bus.template_store import KvTemplateStore
    from shared.bus.topology import (
        KV_API_KEYS,
        KV_DELIVERIES,
        KV_RATES,
        KV_SANDBOXES,
        KV_SESSIONS,
        KV_SNAPSHOTS,
        KV_TEMPLATES,
        KV_USAGE,
        KV_USERS,
        KV_WEBHOOKS,
    )
    from shared.bus.usage import KvUsageStore
    from shared.bus.webhooks import KvDeliveryLog, KvWebhookStore
    from shared.envd.client import ConnectEnvdClient
    from shared.lifecycle.event_query import EventQuery
    from shared.lifecycle.service import SandboxLifecycle
    from shared.lifecycle.snapshots import SnapshotService
    from shared.lifecycle.webhooks import WebhookRegistry
    from shared.quota.guard import QuotaGuard
    from shared.quota.rates import RateLimiter
    from shared.runtime.catalog import FileTemplateCatalog
    from shared.settings import RuntimeSettings, load
    from shared.webhooks.settings import WebhookPolicySettings

    broker = make_broker(bus, service="api")
    await prepare(broker, bus)
    try:
        store = KvSandboxStore(await key_value(broker, KV_SANDBOXES))
        users = KvUsers(NatsBucket(await key_value(broker, KV_USERS)))
        keys = KvApiKeys(NatsBucket(await key_value(broker, KV_API_KEYS)), users)
        rates = RateLimiter(NatsCasBucket(await key_value(broker, KV_RATES)))
        quota = QuotaGuard(quotas, users=users, records=store, rates=rates)
        lifecycle = SandboxLifecycle(store, BrokerPublisher(broker), admission=quota.admit_created)

        async def max_snapshots(user: str) -> int:
            return (await quota.quota_of(user)).max_snapshots

        snapshots = SnapshotService(
            store,
            KvSnapshotStore(await key_value(broker, KV_SNAPSHOTS)),
            BrokerPublisher(broker),
            retention=timedelta(seconds=settings.snapshot_retention_seconds),
            max_snapshots=max_snapshots,
        )
        runtime_settings = load(RuntimeSettings)
        templates = FileTemplateCatalog.from_settings(runtime_settings)
        builds = template_builds(
            settings,
            KvTemplateStore(await key_value(broker, KV_TEMPLATES)),
            BrokerPublisher(broker),
            runtime_settings.data_dir,
        )
        envd = ConnectEnvdClient()
        try:
            yield Wiring(
                settings=settings,
                lifecycle=lifecycle,
                keys=keys,
                templates=templates,
                telemetry=envd,
                quota=quota,
                users=users,
                sessions=Sessions(NatsBucket(await key_value(broker, KV_SESSIONS))),
                snapshots=snapshots,
                events=EventQuery(
                    NatsEventLog(broker.config.connection_state.stream, service="api"), store
                ),
                webhooks=WebhookRegistry(
                    KvWebhookStore(await key_value(broker, KV_WEBHOOKS)),
                    KvDeliveryLog(await key_value(broker, KV_DELIVERIES)),
                    policy=load(WebhookPolicySettings).policy(own_ports=(settings.port,)),
                ),
                usage=KvUsageStore(await key_value(broker, KV_USAGE)),
                builds=builds,
            )
        finally:
            await envd.close()
    finally:
        await broker.stop()


def template_builds(
    settings: ApiSettings, store: TemplateStore, publisher: Publisher, data_dir: Path
) -> TemplateBuilds:
    key = settings.template_upload_key
    return TemplateBuilds(
        store=store,
        publisher=publisher,
        blobs=data_dir / TEMPLATE_FILES_DIR,
        signer_key=key.get_secret_value().encode() if key else secrets.token_bytes(32),
        max_templates=settings.template_max_templates,
        max_concurrent_builds=settings.template_max_concurrent_builds,
        max_upload_bytes=settings.template_max_upload_bytes,
    )


def create_app(
    settings: ApiSettings,
    *,
    wiring: Wiring | None = None,
    bus: BusSettings | None = None,
    registry: CollectorRegistry | None = None,
    limits: HttpLimits | None = None,
    quotas: QuotaSettings | None = None,
) -> FastAPI:
    registry = registry or CollectorRegistry()
    limits = limits if limits is not None else HttpLimits()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if wiring is not None or bus is None:
            yield
            return
        async with bus_wiring(settings, bus, quotas or QuotaSettings()) as wired:
            app.state.wiring = wired
            log.info("api_ready", host=settings.host, port=settings.port)
            yield

    app = FastAPI(
        title="torpor API",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.wiring = wiring
    errors.install(app)
    app.include_router(telemetry.router)  # first: /sandboxes/metrics is not a sandbox id
    app.include_router(e2b.router)
    app.include_router(templates.router)  # before snapshots: /templates/tags is no template id
    app.include_router(snapshots.router)
    app.include_router(events.router)
    app.include_router(webhooks.router)
    app.include_router(usage.router)
    app.include_router(native.router)
    app.include_router(admin.router)
    app.include_router(dashboard_router(bus=bus))

    @app.get(
        "/health",
        tags=["ops"],
        summary="Liveness and readiness",
        responses=errors.error_responses(503),
    )
    async def health(request: Request) -> dict[str, str]:
        if getattr(request.app.state, "wiring", None) is None:
            raise errors.ApiError(503, "the API is starting")
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    # Added first, so it runs inside RequestContext: refusals get a correlation id and a metric.
    app.add_middleware(
        ApiGate,
        settings=settings,
        limits=limits,
        wiring=lambda: getattr(app.state, "wiring", None),
    )
    app.add_middleware(RequestContext, metrics=HttpMetrics(registry, prefix="torpor_api"))
    return app
