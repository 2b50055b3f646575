from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from services.proxy.app import ProxyApp, ProxyWiring
from services.proxy.settings import ENVD_PORT, ProxySettings
from shared.web.limits import HttpLimits
from tests.api.fakes import FakeKeys, FakeLifecycle, FakeRecords
from tests.proxy.upstream import UpstreamState, build_upstream
from tests.security.rawhttp import serve_guarded  # the production server: protocol and limits
from tests.support.serving import serve

# A loopback address of its own, so the stand-in can listen on the daemon's real port (outside
# 127.0.3.0/24, which the test kubelet gives its pods); one per xdist worker ("gw0", "gw1", ...),
# which run these tests side by side.
POD_HOST = f"127.0.4.{220 + int(os.environ.get('PYTEST_XDIST_WORKER', 'gw0')[2:] or 0)}"


@dataclass
class Rig:
    proxy: str
    lifecycle: FakeLifecycle
    keys: FakeKeys
    upstream: UpstreamState
    user_port: int
    app: ProxyApp
    pod_host: str = POD_HOST


@pytest.fixture
def rig() -> Iterator[Rig]:
    state = UpstreamState()
    lifecycle = FakeLifecycle(host=POD_HOST, resume_delay=0.5)
    keys = FakeKeys()
    keys.add("alice-key", "alice")
    keys.add("bob-key", "bob")
    app = ProxyApp(
        ProxySettings(touch_interval=5.0, resume_wait=10, boot_grace=1.0),
        wiring=ProxyWiring(records=FakeRecords(lifecycle), lifecycle=lifecycle, keys=keys),
    )
    upstream = build_upstream(state)
    with (
        serve(upstream, host=POD_HOST, port=ENVD_PORT),
        serve(upstream, host=POD_HOST) as user_url,
        serve_guarded(app, HttpLimits(), backlog=2048) as proxy_url,
    ):
        yield Rig(
            proxy=proxy_url,
            lifecycle=lifecycle,
            keys=keys,
            upstream=state,
            user_port=int(user_url.rsplit(":", 1)[1]),
            app=app,
        )
