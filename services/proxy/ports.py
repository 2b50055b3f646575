"""The proxy's narrow ports: what it needs from the bus (``ProxyWiring``), and what the
connection protocols (``relay``, ``fastpath``) use of the ASGI app (``ProxyCore``, which
``app.ProxyApp`` implements), so that they never import the app that serves them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import Counter
from starlette.types import Scope

from services.proxy.access import Authenticator
from services.proxy.activity import ActivityThrottle, Toucher
from services.proxy.routing import Target
from services.proxy.settings import ProxySettings
from services.proxy.slots import ExchangeSlots
from services.proxy.upstream import UpstreamPool
from services.proxy.waking import Resumer, Waker
from shared.domain.record import SandboxRecord
from shared.web.limits import HttpLimits
from shared.web.requests import InFlight


class RecordSource(Protocol):
    async def get(self, sandbox_id: str) -> SandboxRecord | None: ...

    def peek(self, sandbox_id: str) -> SandboxRecord | None:
        """The record when it is known without any I/O (the fast path's lookup); ``None`` means
        "ask ``get``", not "no such sandbox"."""
        ...

    def remember(self, record: SandboxRecord) -> None:
        """A fresher record learnt another way (e.g. a resume result)."""
        ...


class ProxyLifecycle(Resumer, Toucher, Protocol):
    pass


@dataclass(frozen=True)
class ProxyWiring:
    records: RecordSource
    lifecycle: ProxyLifecycle
    keys: Authenticator | None
    # The owner's running quota and resume rate, before an auto-resume (None: unlimited).
    admit_resume: Callable[[SandboxRecord], Awaitable[None]] | None = None


class ProxyCore(Protocol):
    """The app as the connection protocols see it."""

    settings: ProxySettings
    limits: HttpLimits
    in_flight: InFlight
    waker: Waker | None
    activity: ActivityThrottle | None
    handovers: Counter

    @property
    def wiring(self) -> ProxyWiring | None: ...

    def authorise_by_token(self, scope: Scope, target: Target, record: SandboxRecord) -> bool: ...

    def slot(self, host: str, port: int) -> ExchangeSlots: ...

    def upstream_pool(self) -> UpstreamPool: ...

    def count_refusal(self, status: int) -> None: ...

    def observe_proxied(self, seconds: float, *, fast: bool = False) -> None: ...
