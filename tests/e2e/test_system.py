"""End-to-end behaviour beyond the seed script: the SDK's own pause/set_timeout/list/kill,
auto-resume through the proxy under 200 concurrent requests, and security."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import AuthenticationException

from shared.bus.server import free_port
from tests.support.stack import Stack

pytestmark = pytest.mark.slow


def test_sdk_pause_timeout_list_kill(stack: Stack) -> None:
    sbx = Sandbox.create(
        template="sandbox-base",
        timeout=300,
        lifecycle={"on_timeout": "pause", "auto_resume": True},
        **stack.sdk_opts(),
    )
    assert sbx.commands.run("echo hi").stdout == "hi\n"
    assert sbx.pause() is True
    assert Sandbox.pause(sbx.sandbox_id, **stack.sdk_opts()) is False  # 409: already paused
    assert sbx.get_info().state.value == "paused"
    ids = {s.sandbox_id: s.state.value for s in Sandbox.list(**stack.sdk_opts()).next_items()}
    assert ids[sbx.sandbox_id] == "paused"
    resumed = Sandbox.connect(sbx.sandbox_id, **stack.sdk_opts())
    assert resumed.commands.run("echo back").stdout == "back\n"
    resumed.set_timeout(60)
    info = resumed.get_info()
    assert info.state.value == "running"
    assert 0 < (info.end_at - info.started_at).total_seconds() <= 400
    assert resumed.kill() is True
    assert Sandbox.kill(sbx.sandbox_id, **stack.sdk_opts()) is False


def test_auto_resume_200_concurrent_requests(stack: Stack) -> None:
    port = free_port()
    sbx = Sandbox.create(
        template="sandbox-base",
        timeout=300,
        lifecycle={"on_timeout": "pause", "auto_resume": True},
        **stack.sdk_opts(),
    )
    sbx.commands.run(f"python3 -m http.server {port}", background=True, timeout=0, cwd="/workspace")
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(port)}
    for _ in range(100):
        try:
            if httpx.get(stack.proxy_url + "/", headers=headers, timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        asyncio.run(asyncio.sleep(0.1))
    assert sbx.pause() is True
    before = _resume_count(stack)

    async def burst() -> list[int]:
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=200)) as c:
            rs = await asyncio.gather(
                *(c.get(stack.proxy_url + "/", headers=headers) for _ in range(200))
            )
        return [r.status_code for r in rs]

    assert asyncio.run(burst()) == [200] * 200
    assert _resume_count(stack) - before == 1
    sbx.kill()


def _resume_count(stack: Stack) -> float:
    text = httpx.get(stack.proxy_url + "/metrics").text
    return sum(
        float(m) for m in re.findall(r'torpor_proxy_resumes_total\{outcome="resumed"\} (\S+)', text)
    )


def test_security(stack: Stack) -> None:
    assert httpx.get(stack.api_url + "/v2/sandboxes").status_code == 401
    with pytest.raises(AuthenticationException):
        Sandbox.list(**{**stack.sdk_opts(), "api_key": "torpor_nope"}).next_items()
    sbx = Sandbox.create(template="sandbox-base", **stack.sdk_opts())
    bob = {"X-API-KEY": stack.keys["bob"]}
    for method, path in [
        ("GET", f"/sandboxes/{sbx.sandbox_id}"),
        ("POST", f"/sandboxes/{sbx.sandbox_id}/pause"),
        ("POST", f"/v2/sandboxes/{sbx.sandbox_id}/connect"),
        ("DELETE", f"/sandboxes/{sbx.sandbox_id}"),
        ("POST", f"/api/v1/sandbox/pause/{sbx.sandbox_id}"),
    ]:
        assert httpx.request(method, stack.api_url + path, headers=bob, json={}).status_code == 404
    to = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
    r = httpx.get(stack.proxy_url + "/health", headers={**to, **bob})
    assert r.status_code == 404
    r = httpx.get(stack.proxy_url + "/health", headers={**to, "X-Access-Token": "wrong"})
    assert r.status_code == 401
    rpc = {**to, "Content-Type": "application/json", "Connect-Protocol-Version": "1"}
    r = httpx.post(
        stack.proxy_url + "/process.Process/List", headers={**rpc, "X-Access-Token": "x"}, json={}
    )
    assert r.status_code == 401
    r = httpx.post(
        stack.proxy_url + "/process.Process/List",
        headers={**rpc, "X-Access-Token": sbx._envd_access_token or ""},  # type: ignore[attr-defined]
        json={},
    )
    assert r.status_code == 200
    sbx.kill()
    logs = stack.all_logs()
    for secret in stack.keys.values():
        assert secret not in logs
