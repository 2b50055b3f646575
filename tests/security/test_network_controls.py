"""E2B network controls end to end with the unmodified SDK on a real stack (local runtime):
create-time policy → record → workload, ``update_network`` applied to the live workload and
kept across pause/resume, ``allowPublicTraffic=false`` enforced at the proxy with the traffic
access token, and anonymous traffic never extending such a sandbox.

The egress filtering itself (nftables in the pod's network namespace) is the local runtime's
job and is tested from inside a sandbox in ``test_pod_network``; here the check is that the
policy the SDK asked for is what the runtime was told to enforce.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import nats
import pytest
from e2b import Sandbox

from shared.bus.server import free_port
from shared.bus.topology import KV_SANDBOXES
from shared.domain.record import SandboxRecord
from shared.models.network import NetworkPolicy
from shared.runtime.local.instance import DEFAULT_BUCKET
from shared.runtime.local.records import WorkloadRecord, workload_key
from tests.support.stack import Stack

pytestmark = pytest.mark.slow


async def _read(nats_url: str, bucket: str, key: str) -> bytes | None:
    nc = await nats.connect(nats_url)
    try:
        entry = await (await nc.jetstream().key_value(bucket)).get(key)
        return entry.value
    finally:
        await nc.close()


def workload_network(stack: Stack, sandbox_id: str) -> NetworkPolicy:
    raw = asyncio.run(_read(stack.nats_url, DEFAULT_BUCKET, workload_key(sandbox_id)))
    assert raw is not None
    return WorkloadRecord.model_validate_json(raw).network


def record_of(stack: Stack, sandbox_id: str) -> SandboxRecord:
    raw = asyncio.run(_read(stack.nats_url, KV_SANDBOXES, sandbox_id))
    assert raw is not None
    return SandboxRecord.model_validate_json(raw)


def eventually_network(stack: Stack, sandbox_id: str, want: NetworkPolicy) -> None:
    deadline = time.monotonic() + 30
    while (got := workload_network(stack, sandbox_id)) != want:
        assert time.monotonic() < deadline, f"workload network {got} never became {want}"
        time.sleep(0.2)


@pytest.fixture
def closed(stack: Stack) -> Iterator[Sandbox]:
    sbx = Sandbox.create(
        template="sandbox-base",
        timeout=300,
        allow_internet_access=False,
        network={
            "allow_out": ["10.1.2.3"],
            "deny_out": ["192.168.0.0/16"],
            "allow_public_traffic": False,
        },
        lifecycle={"on_timeout": "pause", "auto_resume": True},
        **stack.sdk_opts(),
    )
    yield sbx
    sbx.kill()


def test_create_policy_round_trips_and_reaches_the_workload(stack: Stack, closed: Sandbox) -> None:
    info = closed.get_info()
    assert info.allow_internet_access is False
    assert info.network == {
        "allow_out": ["10.1.2.3/32"],
        "deny_out": ["192.168.0.0/16"],
        "allow_public_traffic": False,
    }
    want = NetworkPolicy(
        allow_internet=False,
        allow_out=("10.1.2.3/32",),
        deny_out=("192.168.0.0/16",),
        allow_public_traffic=False,
    )
    assert record_of(stack, closed.sandbox_id).network == want
    assert workload_network(stack, closed.sandbox_id) == want
    assert want.permits("10.1.2.3")
    assert not want.permits("192.168.1.1")
    assert not want.permits("203.0.113.9")


def test_update_network_is_live_and_kept_across_pause_resume(stack: Stack, closed: Sandbox) -> None:
    closed.update_network({"allow_out": ["10.9.9.9"], "deny_out": ["0.0.0.0/0"]})
    info = closed.get_info()
    # An update replaces the egress rules; omitted allow_internet_access means allowed again.
    assert info.allow_internet_access is True
    assert info.network == {
        "allow_out": ["10.9.9.9/32"],
        "deny_out": ["0.0.0.0/0"],
        "allow_public_traffic": False,  # not part of an update: kept
    }
    live = NetworkPolicy(
        allow_out=("10.9.9.9/32",), deny_out=("0.0.0.0/0",), allow_public_traffic=False
    )
    eventually_network(stack, closed.sandbox_id, live)

    assert closed.pause() is True
    Sandbox.update_network(
        closed.sandbox_id,
        {"deny_out": ["10.0.0.0/8"], "allow_internet_access": True},
        **stack.sdk_opts(),
    )
    paused = NetworkPolicy(deny_out=("10.0.0.0/8",), allow_public_traffic=False)
    eventually_network(stack, closed.sandbox_id, paused)  # the workload at 0 replicas keeps it
    again = Sandbox.connect(closed.sandbox_id, **stack.sdk_opts())
    assert again.commands.run("echo up").stdout == "up\n"
    assert workload_network(stack, closed.sandbox_id) == paused
    assert record_of(stack, closed.sandbox_id).network == paused

    # Another user cannot read or change it; domain names are refused, naming the field.
    bob = {"X-API-KEY": stack.keys["bob"]}
    url = f"{stack.api_url}/sandboxes/{closed.sandbox_id}/network"
    assert httpx.put(url, headers=bob, json={}, trust_env=False).status_code == 404
    alice = {"X-API-KEY": stack.keys["alice"]}
    r = httpx.put(url, headers=alice, json={"allowOut": ["example.com"]}, trust_env=False)
    assert r.status_code == 400
    assert "allowOut" in r.json()["message"]
    assert workload_network(stack, closed.sandbox_id) == paused


def _serve(sbx: Sandbox, stack: Stack) -> dict[str, str]:
    port = free_port()
    sbx.commands.run(f"python3 -m http.server {port}", background=True, timeout=0, cwd="/workspace")
    return {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(port)}


def _get(stack: Stack, headers: dict[str, str]) -> int:
    return httpx.get(
        stack.proxy_url + "/", headers=headers, timeout=60, trust_env=False
    ).status_code


def test_private_ports_need_the_traffic_token(stack: Stack, closed: Sandbox) -> None:
    token = closed.traffic_access_token
    assert isinstance(token, str)
    assert len(token) >= 32
    assert token != closed._envd_access_token  # type: ignore[attr-defined]
    to = _serve(closed, stack)
    with_token = {**to, "e2b-traffic-access-token": token}
    deadline = time.monotonic() + 30
    while _get(stack, with_token) != 200:
        assert time.monotonic() < deadline, "the sandbox's server never answered with the token"
        time.sleep(0.2)

    # Past the proxy's touch interval (5 s): a request it counted as activity would touch now.
    time.sleep(6)
    before = record_of(stack, closed.sandbox_id).deadline
    for headers in (
        to,
        {**to, "e2b-traffic-access-token": "wrong"},
        {**to, "e2b-traffic-access-token": token[:-1]},
        {**to, "X-Access-Token": "wrong"},
        {**to, "X-API-KEY": stack.keys["bob"]},
    ):
        assert _get(stack, headers) in (401, 403, 404), headers
    time.sleep(2)  # a touch is written in the background
    assert record_of(stack, closed.sandbox_id).deadline == before

    # The daemon port is unaffected: the SDK's own calls go through with the envd token.
    assert closed.commands.run("echo daemon").stdout == "daemon\n"
    # Connect returns the same token (derived, never stored).
    again = Sandbox.connect(closed.sandbox_id, **stack.sdk_opts())
    assert again.traffic_access_token == token
    logs = stack.all_logs()
    assert token not in logs


def test_public_sandbox_anonymous_traffic_wakes_it_by_default(stack: Stack) -> None:
    sbx = Sandbox.create(
        template="sandbox-base",
        timeout=300,
        lifecycle={"on_timeout": "pause", "auto_resume": True},
        **stack.sdk_opts(),
    )
    try:
        assert sbx.traffic_access_token is None  # public: no token needed, none returned
        to = _serve(sbx, stack)
        deadline = time.monotonic() + 30
        while _get(stack, to) != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert sbx.pause() is True
        assert _get(stack, to) == 200  # anonymous, through a public port: resumed (E2B default)
        assert sbx.get_info().state.value == "running"
    finally:
        sbx.kill()
