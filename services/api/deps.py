"""Request dependencies: the caller (API key as ``X-API-KEY`` or ``Authorization: Bearer``) and
the wired services on ``app.state``. Keys are never logged; only the user name is bound."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Protocol

import structlog
from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from services.api.errors import ApiError
from services.api.gate import AUTHENTICATED
from services.api.sessions import Sessions
from services.api.settings import ApiSettings
from services.api.template_builds import TemplateBuilds
from shared.auth.models import User
from shared.domain.record import SandboxRecord
from shared.lifecycle.event_query import Page
from shared.lifecycle.webhooks import Changes
from shared.models.public_events import PublicEvent
from shared.models.quota import Quota, QuotaOverride
from shared.models.snapshot_records import SnapshotRecord
from shared.models.webhooks import DeliveryRecord, Webhook
from shared.ports.envd import EnvdTelemetry
from shared.ports.lifecycle import Lifecycle
from shared.ports.usage import UsageStore
from shared.runtime.catalog import TemplateCatalog


class Authenticator(Protocol):
    """The slice of ``shared.auth.ports.ApiKeys`` the API needs."""

    async def authenticate(self, secret: str) -> User | None: ...

    async def user_for_digest(self, digest: str) -> User | None:
        """The user of the unrevoked key stored under this sha256 (dashboard sessions)."""
        ...


class Quotas(Protocol):
    """The slice of ``shared.quota.guard.QuotaGuard`` the routes use (the create check after
    insertion is the lifecycle's admission hook)."""

    async def before_create(self, user: str) -> None: ...

    async def before_resume(self, record: SandboxRecord) -> None: ...

    async def quota_of(self, user: str) -> Quota: ...


class Snapshots(Protocol):
    """The slice of ``shared.lifecycle.snapshots.SnapshotService`` the routes use."""

    async def take(
        self,
        sandbox_id: str,
        *,
        owner: str | None,
        name: str | None = None,
        internal: bool = False,
        files_only: bool = False,
        wait: float = 55.0,
    ) -> SnapshotRecord: ...

    async def get(self, snapshot_id: str, *, owner: str | None) -> SnapshotRecord: ...

    async def list(
        self, *, owner: str | None, sandbox_id: str | None = None, name: str | None = None
    ) -> list[SnapshotRecord]: ...

    async def delete(self, snapshot_id: str, *, owner: str | None) -> None: ...


class EventReader(Protocol):
    """The slice of ``shared.lifecycle.event_query.EventQuery`` the events API uses."""

    async def of_sandbox(
        self, sandbox_id: str, *, owner: str | None, page: Page
    ) -> list[PublicEvent]: ...

    async def of_owner(self, owner: str | None, *, page: Page) -> list[PublicEvent]: ...


class WebhookAdmin(Protocol):
    """The slice of ``shared.lifecycle.webhooks.WebhookRegistry`` the routes use."""

    async def create(
        self,
        owner: str,
        *,
        url: str,
        events: Sequence[str],
        name: str = "",
        enabled: bool = True,
        secret: str | None = None,
    ) -> Webhook: ...

    async def get(self, owner: str, webhook_id: str) -> Webhook: ...

    async def owned(self, owner: str) -> list[Webhook]: ...

    async def update(self, owner: str, webhook_id: str, changes: Changes) -> Webhook: ...

    async def delete(self, owner: str, webhook_id: str) -> None: ...

    async def deliveries(
        self, owner: str, webhook_id: str, *, limit: int
    ) -> list[DeliveryRecord]: ...


class UserAdmin(Protocol):
    async def get(self, name: str) -> User | None: ...

    async def set_quota(self, name: str, quota: QuotaOverride | None) -> User: ...


@dataclass(frozen=True)
class Wiring:
    """What the routes use; put on ``app.state.wiring`` by the app factory or its lifespan."""

    settings: ApiSettings
    lifecycle: Lifecycle
    keys: Authenticator
    templates: TemplateCatalog | None = None  # None: templates are not checked before a create
    telemetry: EnvdTelemetry | None = None  # sandbox metrics and logs; None: always empty
    quota: Quotas | None = None  # None: no quotas nor rate limits (unit tests with fakes)
    users: UserAdmin | None = None  # the admin API's user store; None: 503 there
    sessions: Sessions | None = None  # dashboard sessions; None: in memory (one process)
    snapshots: Snapshots | None = None  # stored snapshots and fork; None: 501 there
    events: EventReader | None = None  # the events API; None: 501 there
    webhooks: WebhookAdmin | None = None  # webhook registrations; None: 501 there
    usage: UsageStore | None = None  # the usage ledger (read); None: 501 there
    builds: TemplateBuilds | None = None  # templates users build; None: 501 there


_api_key = APIKeyHeader(name="X-API-KEY", auto_error=False, description="An API key (E2B SDK)")
_bearer = HTTPBearer(auto_error=False, description="An API key as a Bearer token")


@dataclass(frozen=True)
class Caller:
    user: User

    @property
    def name(self) -> str:
        return self.user.name

    @property
    def scope(self) -> str | None:
        """The owner filter for reads and writes: admins see every sandbox."""
        return None if self.user.admin else self.user.name


def wiring(request: Request) -> Wiring:
    found: Wiring | None = getattr(request.app.state, "wiring", None)
    if found is None:
        raise ApiError(503, "the API is starting")
    return found


async def caller(
    request: Request,
    w: Annotated[Wiring, Depends(wiring)],
    api_key: Annotated[str | None, Security(_api_key)] = None,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)] = None,
) -> Caller:
    secret = api_key or (bearer.credentials if bearer else None)
    if not secret:
        raise ApiError(401, "missing API key: send X-API-KEY or Authorization: Bearer")
    secret = secret.strip()
    checked = request.scope.get(AUTHENTICATED)  # the gate already looked this key up
    user = checked[1] if checked and checked[0] == secret else await w.keys.authenticate(secret)
    if user is None:
        raise ApiError(401, "invalid API key")
    structlog.contextvars.bind_contextvars(user=user.name)
    return Caller(user)


def require_template(w: Wiring, name: str, *, field: str) -> None:
    """An unknown template is the caller's mistake: 400 before any record exists."""
    if w.templates is not None and not w.templates.exists(name):
        raise ApiError(400, f"{field}: template {name!r} does not exist")


WiringDep = Annotated[Wiring, Depends(wiring)]
CallerDep = Annotated[Caller, Depends(caller)]
