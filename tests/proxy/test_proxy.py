"""The proxy over real sockets: routing, streaming, large bodies, WebSocket, tokens, scoping,
auto-resume (one shared resume for 200 concurrent requests), activity throttling."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from services.proxy.settings import ENVD_PORT
from shared.domain.record import SandboxRecord
from shared.ports.lifecycle import CreateRequest
from tests.proxy.conftest import Rig


def make(
    rig: Rig, *, owner: str = "alice", auto_resume: bool = True, paused: bool = False
) -> SandboxRecord:
    record = asyncio.run(
        rig.lifecycle.create(CreateRequest(owner=owner, auto_pause=True, auto_resume=auto_resume))
    )
    if paused:
        record = asyncio.run(rig.lifecycle.pause(record.sandbox_id, owner=None))
    return record


def to(record: SandboxRecord, port: int = ENVD_PORT, token: bool = True) -> dict[str, str]:
    headers = {"E2b-Sandbox-Id": record.sandbox_id, "E2b-Sandbox-Port": str(port)}
    if token and record.envd_access_token:
        headers["X-Access-Token"] = record.envd_access_token
    return headers


def test_routes_by_headers_and_host(rig: Rig) -> None:
    sbx = make(rig)
    r = httpx.get(f"{rig.proxy}/echo?a=1", headers={**to(sbx), "X-API-KEY": "alice-key"})
    assert r.status_code == 200, r.text
    seen = r.json()
    assert seen["path"] == "/echo"
    assert seen["query"] == "a=1"
    # torpor's credentials and routing headers stay outside the sandbox
    assert "x-api-key" not in seen["headers"]
    assert "e2b-sandbox-id" not in seen["headers"]
    host = f"{rig.user_port}-{sbx.sandbox_id}.sandbox.example"
    r = httpx.get(f"{rig.proxy}/echo", headers={"Host": host})
    assert r.status_code == 200
    assert r.json()["headers"]["x-forwarded-host"] == host
    r = httpx.get(f"{rig.proxy}/health", headers=to(sbx))  # envd's /health, not the proxy's
    assert r.status_code == 204


def test_streams_without_buffering_and_large_bodies(rig: Rig) -> None:
    sbx = make(rig)
    with httpx.Client(timeout=10) as client:
        with client.stream("GET", f"{rig.proxy}/gated", headers=to(sbx, rig.user_port)) as r:
            lines = r.iter_lines()
            assert next(lines) == "first"  # arrives while the upstream still holds "second"
            rig.upstream.release.set()
            assert next(lines) == "second"
        payload = os.urandom(24 * 1024 * 1024)

        def chunks():
            for i in range(0, len(payload), 1 << 20):
                yield payload[i : i + (1 << 20)]

        r = client.post(f"{rig.proxy}/digest", content=chunks(), headers=to(sbx, rig.user_port))
        assert r.json() == {"sha256": hashlib.sha256(payload).hexdigest(), "size": len(payload)}
        r = client.get(f"{rig.proxy}/big?size={50 * 1024 * 1024}", headers=to(sbx, rig.user_port))
        assert len(r.content) == 50 * 1024 * 1024


def test_client_disconnect_closes_the_upstream_stream(rig: Rig) -> None:
    sbx = make(rig)
    with httpx.Client(timeout=10) as client:
        with client.stream("GET", f"{rig.proxy}/endless", headers=to(sbx, rig.user_port)) as r:
            assert next(r.iter_lines()) == "tick"
    assert rig.upstream.stream_closed.wait(5), "the proxy kept reading a stream nobody wants"


def test_websocket(rig: Rig) -> None:
    sbx = make(rig)
    url = rig.proxy.replace("http://", "ws://") + "/ws"
    with ws_connect(url, additional_headers=to(sbx, rig.user_port), subprotocols=["chat"]) as ws:
        assert ws.subprotocol == "chat"
        ws.send("hi")
        assert ws.recv() == "echo:hi"
        ws.send(b"\x01\x02\x03")
        assert ws.recv() == b"\x03\x02\x01"


def test_daemon_token_and_other_users(rig: Rig) -> None:
    sbx = make(rig)
    r = httpx.get(f"{rig.proxy}/echo", headers=to(sbx, token=False))
    assert r.status_code == 401
    assert r.json()["code"] == 401
    r = httpx.get(f"{rig.proxy}/echo", headers={**to(sbx, token=False), "X-Access-Token": "nope"})
    assert r.status_code == 401
    # the token of another sandbox does not open this one
    other = make(rig, owner="bob")
    r = httpx.get(
        f"{rig.proxy}/echo",
        headers={**to(sbx, token=False), "X-Access-Token": other.envd_access_token or ""},
    )
    assert r.status_code == 401
    # another user's API key: the sandbox does not exist for them
    r = httpx.get(f"{rig.proxy}/echo", headers={**to(sbx), "X-API-KEY": "bob-key"})
    assert r.status_code == 404
    assert r.json()["code"] == 404
    r = httpx.get(f"{rig.proxy}/echo", headers={**to(sbx, rig.user_port), "X-API-KEY": "bob-key"})
    assert r.status_code == 404
    r = httpx.get(f"{rig.proxy}/echo", headers={**to(sbx), "X-API-KEY": "forged"})
    assert r.status_code == 401
    # the owner's key works without the token
    r = httpx.get(f"{rig.proxy}/echo", headers={**to(sbx, token=False), "X-API-KEY": "alice-key"})
    assert r.status_code == 200


def test_unknown_paused_and_closed_ports(rig: Rig) -> None:
    r = httpx.get(f"{rig.proxy}/echo", headers={"E2b-Sandbox-Id": "ghost"})
    assert r.status_code == 502
    assert "was not found" in r.json()["message"]
    asleep = make(rig, auto_resume=False, paused=True)
    r = httpx.get(f"{rig.proxy}/echo", headers=to(asleep))
    assert r.status_code == 502
    assert "was not found" in r.json()["message"]
    assert rig.lifecycle.resume_calls == 0
    sbx = make(rig)
    r = httpx.get(f"{rig.proxy}/echo", headers=to(sbx, port=1))
    assert r.status_code == 502
    assert "port is not open" in r.json()["message"]
    r = httpx.get(f"{rig.proxy}/echo", headers={"E2b-Sandbox-Id": "Bad!"})
    assert r.status_code == 400
    assert httpx.get(f"{rig.proxy}/health").status_code == 200


@pytest.mark.slow
def test_200_concurrent_requests_share_one_resume(rig: Rig) -> None:
    sbx = make(rig, paused=True)

    async def burst() -> list[int]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:
            responses = await asyncio.gather(
                *(
                    client.get(f"{rig.proxy}/echo", headers=to(sbx, rig.user_port))
                    for _ in range(200)
                )
            )
        return [r.status_code for r in responses]

    statuses = asyncio.run(burst())
    assert statuses == [200] * 200
    assert rig.lifecycle.resume_calls == 1
    assert rig.upstream.requests >= 200


def test_activity_is_throttled(rig: Rig) -> None:
    sbx = make(rig)
    with httpx.Client() as client:
        for _ in range(30):
            client.get(f"{rig.proxy}/echo", headers=to(sbx, rig.user_port))
    deadline = time.monotonic() + 2
    while not rig.lifecycle.touches and time.monotonic() < deadline:
        time.sleep(0.02)
    assert rig.lifecycle.touches == [sbx.sandbox_id]
