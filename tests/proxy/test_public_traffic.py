"""Who may reach a sandbox's user ports, and who may wake it: ``allowPublicTraffic=false``
(the traffic access token, header ``e2b-traffic-access-token``) and the anonymous-wake setting
(``TORPOR_PROXY_ANONYMOUS_WAKE``), over real sockets with stand-in sandboxes."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from shared.auth.traffic import traffic_token
from shared.domain.record import SandboxRecord
from shared.models.network import NetworkPolicy
from shared.ports.lifecycle import CreateRequest
from tests.proxy.conftest import Rig

PRIVATE = NetworkPolicy(allow_public_traffic=False)


def make(rig: Rig, *, network: NetworkPolicy | None = None, paused: bool = False) -> SandboxRecord:
    request = CreateRequest(owner="alice", auto_pause=True, auto_resume=True)
    if network is not None:
        request = request.model_copy(update={"network": network})
    record = asyncio.run(rig.lifecycle.create(request))
    if paused:
        record = asyncio.run(rig.lifecycle.pause(record.sandbox_id, owner=None))
    return record


def user_port(rig: Rig, record: SandboxRecord, **extra: str) -> dict[str, str]:
    return {"E2b-Sandbox-Id": record.sandbox_id, "E2b-Sandbox-Port": str(rig.user_port), **extra}


def get(rig: Rig, headers: dict[str, str]) -> httpx.Response:
    return httpx.get(f"{rig.proxy}/echo", headers=headers, timeout=30)


def settle() -> None:
    time.sleep(0.3)  # activity touches run in the background


def test_private_ports_need_the_token_and_anonymous_never_touches(rig: Rig) -> None:
    sbx = make(rig, network=PRIVATE)
    token = traffic_token(sbx.sandbox_id, sbx.envd_access_token)
    assert token is not None
    for headers in (
        user_port(rig, sbx),
        user_port(rig, sbx, **{"e2b-traffic-access-token": "x" * len(token)}),
        user_port(rig, sbx, **{"e2b-traffic-access-token": token.upper()}),
        user_port(rig, sbx, **{"X-Access-Token": "nope"}),
    ):
        r = get(rig, headers)
        assert r.status_code == 403, headers
        assert "e2b-traffic-access-token" in r.json()["message"]
    settle()
    assert rig.lifecycle.touches == []
    assert rig.upstream.requests == 0
    # Another sandbox's token opens nothing here.
    other = make(rig, network=PRIVATE)
    foreign = traffic_token(other.sandbox_id, other.envd_access_token) or ""
    assert get(rig, user_port(rig, sbx, **{"e2b-traffic-access-token": foreign})).status_code == 403

    r = get(rig, user_port(rig, sbx, **{"e2b-traffic-access-token": token}))
    assert r.status_code == 200
    # The token is the proxy's: it is not forwarded to the sandbox.
    assert "e2b-traffic-access-token" not in r.json()["headers"]
    # The daemon token and the owner's API key are credentials too.
    envd = {"X-Access-Token": sbx.envd_access_token or ""}
    assert get(rig, user_port(rig, sbx, **envd)).status_code == 200
    assert get(rig, user_port(rig, sbx, **{"X-API-KEY": "alice-key"})).status_code == 200
    # The daemon port still wants the envd token, whatever the traffic token says.
    daemon = {"E2b-Sandbox-Id": sbx.sandbox_id, "e2b-traffic-access-token": token}
    assert get(rig, daemon).status_code == 401


def test_private_paused_sandbox_is_not_woken_by_anonymous_traffic(rig: Rig) -> None:
    sbx = make(rig, network=PRIVATE, paused=True)
    assert get(rig, user_port(rig, sbx)).status_code == 403
    settle()
    assert rig.lifecycle.resume_calls == 0
    assert rig.lifecycle.touches == []
    token = traffic_token(sbx.sandbox_id, sbx.envd_access_token) or ""
    assert get(rig, user_port(rig, sbx, **{"e2b-traffic-access-token": token})).status_code == 200
    assert rig.lifecycle.resume_calls == 1


@pytest.mark.parametrize("anonymous_wake", [True, False])
def test_anonymous_wake_setting(rig: Rig, anonymous_wake: bool) -> None:
    rig.app.settings = rig.app.settings.model_copy(update={"anonymous_wake": anonymous_wake})
    sbx = make(rig, paused=True)
    r = get(rig, user_port(rig, sbx))
    if anonymous_wake:
        assert r.status_code == 200
        assert rig.lifecycle.resume_calls == 1
        return
    assert r.status_code == 502  # the SDK's "sandbox not running"
    assert "anonymous" in r.json()["message"]
    assert rig.lifecycle.resume_calls == 0
    # A credential still wakes it: the owner's key, or the envd token.
    assert get(rig, user_port(rig, sbx, **{"X-API-KEY": "alice-key"})).status_code == 200
    assert rig.lifecycle.resume_calls == 1
