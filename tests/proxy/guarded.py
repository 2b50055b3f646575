"""The proxy with small limits under the production server, in front of a raw upstream where
alice's one sandbox runs: the deadline and body-limit tests of tests/proxy and tests/security."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from services.proxy.app import ProxyApp, ProxyWiring
from services.proxy.settings import ProxySettings
from shared.domain.record import SandboxRecord
from shared.ports.lifecycle import CreateRequest
from shared.web.limits import HttpLimits
from tests.api.fakes import FakeLifecycle, FakeRecords
from tests.proxy.upstream import UpstreamState, build_upstream
from tests.security.rawhttp import serve_guarded
from tests.support.serving import serve

# The proxy's URL, alice's sandbox, the raw upstream's port, what the upstream saw.
Guarded = tuple[str, SandboxRecord, int, UpstreamState]


@contextlib.contextmanager
def guarded_proxy(
    host: str, limits: HttpLimits, settings: ProxySettings | None = None, **server: Any
) -> Iterator[Guarded]:
    """The proxy with ``limits`` and ``settings`` (default: a 5 s body timeout) under the
    production server (``server``: uvicorn options), the upstream on ``host``."""
    state = UpstreamState()
    lifecycle = FakeLifecycle(host=host)
    app = ProxyApp(
        settings or ProxySettings(body_timeout=5.0),
        wiring=ProxyWiring(records=FakeRecords(lifecycle), lifecycle=lifecycle, keys=None),
        limits=limits,
    )
    with (
        serve(build_upstream(state), host=host) as upstream,
        serve_guarded(app, limits, **server) as url,
    ):
        record = asyncio.run(lifecycle.create(CreateRequest(owner="alice")))
        yield url, record, int(upstream.rsplit(":", 1)[1]), state
