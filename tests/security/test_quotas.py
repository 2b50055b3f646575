"""Per-user quotas and rate limits: held sandboxes, running sandboxes, create and resume rates.
429 with ``Retry-After`` and the E2B error shape; works again once the user frees something (or
the bucket refills); overrides per user through ``torpor keys quota`` and the admin API; the
rate buckets are shared by replicas (compare-and-set in NATS KV)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import nats
import pytest
from e2b import Sandbox
from e2b.exceptions import RateLimitException

from shared.bus.kv import NatsCasBucket
from shared.bus.server import EmbeddedNats
from shared.bus.topology import KV_RATES, ensure_topology
from shared.errors import QuotaExceeded
from shared.quota.rates import RateLimiter
from tests.support.env import torpor
from tests.support.stack import Stack

# ---- rate buckets over real NATS KV ------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_rate_buckets_refill_and_are_shared_by_replicas(fresh_nats: EmbeddedNats) -> None:
    nc = await nats.connect(fresh_nats.url)
    try:
        js = nc.jetstream()
        await ensure_topology(js)
        clock = Clock()
        replicas = [
            RateLimiter(NatsCasBucket(await js.key_value(KV_RATES)), clock=clock) for _ in range(3)
        ]
        # 30 concurrent takes from three "replicas" on a bucket of 5 that does not refill
        # meanwhile (the clock stands still): exactly 5 succeed.
        results = await asyncio.gather(
            *(replicas[i % 3].take("create", "alice", per_minute=60, burst=5) for i in range(30)),
            return_exceptions=True,
        )
        assert sum(r is None for r in results) == 5
        refused = [r for r in results if isinstance(r, QuotaExceeded)]
        assert len(refused) == 25
        assert all(r.retry_after == 1 and r.retryable for r in refused)
        clock.now += 2  # 60 a minute: two tokens back
        await replicas[0].take("create", "alice", per_minute=60, burst=5)
        await replicas[1].take("create", "alice", per_minute=60, burst=5)
        with pytest.raises(QuotaExceeded):
            await replicas[2].take("create", "alice", per_minute=60, burst=5)
        # Per user and per action: bob and alice's resumes are untouched.
        await replicas[0].take("create", "bob", per_minute=60, burst=5)
        await replicas[0].take("resume", "alice", per_minute=60, burst=5)
        await replicas[0].take("create", "alice", per_minute=0, burst=1)  # 0: unlimited
    finally:
        await nc.close()


# ---- the real stack ----------------------------------------------------------------------------


def torpor_keys_quota(stack: Stack, *args: str) -> str:
    done = torpor("keys", "quota", *args, "--nats-url", stack.nats_url)
    assert done.returncode == 0, done.stderr
    return done.stdout


@contextmanager
def client(stack: Stack, user: str) -> Iterator[httpx.Client]:
    with stack.client(user, timeout=120) as c:
        yield c


def set_quota(stack: Stack, user: str, **limits: object) -> httpx.Response:
    with client(stack, "root") as admin:
        return admin.put(f"/api/v1/users/{user}/quota", json=limits)


def assert_429(response: httpx.Response, *, retryable: bool) -> int:
    assert response.status_code == 429, response.text
    body = response.json()
    assert body["code"] == 429
    assert body["message"]
    retry_after = int(response.headers["retry-after"])
    assert retry_after >= 1
    assert (response.headers.get("should-retry") == "false") is not retryable
    return retry_after


def kill_all(stack: Stack, user: str) -> None:
    with client(stack, user) as c:
        for sbx in c.get("/api/v1/sandbox").json()["sandboxes"]:
            c.delete(f"/api/v1/sandbox/{sbx['name']}")


def test_held_sandboxes_quota_via_the_cli(stack: Stack) -> None:
    out = torpor_keys_quota(stack, "bob", "--max-sandboxes", "2")
    assert "max_sandboxes        2" in out
    try:
        with client(stack, "bob") as bob:
            first = bob.post("/api/v1/sandbox", json={"timeout": 120})
            assert first.status_code == 201, first.text
            second = bob.post("/api/v1/sandbox", json={"timeout": 120})
            assert second.status_code == 201, second.text
            bob.post(f"/api/v1/sandbox/pause/{second.json()['name']}")  # paused ones count too
            assert_429(bob.post("/api/v1/sandbox", json={"timeout": 120}), retryable=False)
            # The E2B path and the unmodified SDK see the same refusal (and do not retry it).
            env = stack.sdk_env("bob")
            with pytest.raises(RateLimitException):
                Sandbox.create(
                    timeout=60,
                    api_key=env["E2B_API_KEY"],
                    api_url=env["E2B_API_URL"],
                    sandbox_url=env["E2B_SANDBOX_URL"],
                )
            assert len(bob.get("/api/v1/sandbox").json()["sandboxes"]) == 2  # nothing leaked
            assert bob.delete(f"/api/v1/sandbox/{first.json()['name']}").status_code == 204
            again = bob.post("/api/v1/sandbox", json={"timeout": 120})
            assert again.status_code == 201, again.text
    finally:
        kill_all(stack, "bob")
        assert "max_sandboxes        default" in torpor_keys_quota(stack, "bob", "--clear")


def test_concurrent_creates_never_exceed_the_quota(stack: Stack) -> None:
    assert set_quota(stack, "bob", maxSandboxes=3).status_code == 200
    try:

        def create(_: int) -> int:
            with client(stack, "bob") as bob:
                return bob.post("/api/v1/sandbox", json={"timeout": 120}).status_code

        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(create, range(8)))
        assert set(statuses) <= {201, 429}, statuses
        assert 1 <= statuses.count(201) <= 3, statuses
        with client(stack, "bob") as bob:
            assert len(bob.get("/api/v1/sandbox").json()["sandboxes"]) == statuses.count(201)
    finally:
        kill_all(stack, "bob")
        set_quota(stack, "bob")


def test_create_rate_limit_then_it_refills(stack: Stack) -> None:
    response = set_quota(stack, "alice", createsPerMinute=3, createBurst=1)
    assert response.status_code == 200, response.text
    assert response.json()["quota"]["createBurst"] == 1
    try:
        with client(stack, "alice") as alice:
            assert alice.post("/api/v1/sandbox", json={"timeout": 60}).status_code == 201
            retry_after = assert_429(
                alice.post("/api/v1/sandbox", json={"timeout": 60}), retryable=True
            )
            assert retry_after <= 20  # 3 a minute: one token every 20 s
            for _ in range(10):  # bounded: the bucket refills after Retry-After
                time.sleep(retry_after)
                again = alice.post("/api/v1/sandbox", json={"timeout": 60})
                if again.status_code == 201:
                    break
                retry_after = assert_429(again, retryable=True)
            else:
                pytest.fail("the create rate never refilled")
    finally:
        kill_all(stack, "alice")
        set_quota(stack, "alice")


def test_running_quota_holds_for_resume_connect_and_the_proxy(stack: Stack) -> None:
    assert set_quota(stack, "bob", maxRunning=1).status_code == 200
    try:
        with client(stack, "bob") as bob:
            created = bob.post(
                "/api/v1/sandbox", json={"timeout": 120, "autoResume": True, "autoPause": True}
            )
            assert created.status_code == 201, created.text
            paused = created.json()["name"]
            assert bob.post(f"/api/v1/sandbox/pause/{paused}").status_code == 200
            other = bob.post("/api/v1/sandbox", json={"timeout": 120})
            assert other.status_code == 201, other.text
            # One running: no second create, and no resume by any door.
            assert_429(bob.post("/api/v1/sandbox", json={"timeout": 120}), retryable=False)
            assert_429(bob.post(f"/api/v1/sandbox/resume/{paused}"), retryable=False)
            e2b = {"X-API-KEY": stack.keys["bob"]}
            assert_429(
                bob.post(f"/sandboxes/{paused}/connect", json={}, headers=e2b), retryable=False
            )
            proxied = httpx.get(
                f"{stack.proxy_url}/health",
                headers={
                    "E2b-Sandbox-Id": paused,
                    "E2b-Sandbox-Port": "49983",
                    "X-API-KEY": stack.keys["bob"],
                },
                timeout=60,
            )
            assert proxied.status_code == 429, proxied.text
            assert proxied.json()["code"] == 429
            assert int(proxied.headers["retry-after"]) >= 1
            assert bob.get(f"/api/v1/sandbox/{paused}").json()["state"] == "paused"
            # Free the slot: the resume goes through.
            assert bob.delete(f"/api/v1/sandbox/{other.json()['name']}").status_code == 204
            resumed = bob.post(f"/api/v1/sandbox/resume/{paused}")
            assert resumed.status_code == 200, resumed.text
            assert resumed.json()["state"] == "running"
    finally:
        kill_all(stack, "bob")
        set_quota(stack, "bob")


def test_quota_admin_api_refuses_hostile_and_unauthorised_calls(stack: Stack) -> None:
    with client(stack, "alice") as alice:
        assert (
            alice.put("/api/v1/users/alice/quota", json={"maxSandboxes": 1000}).status_code == 403
        )
        assert alice.get("/api/v1/users/bob/quota").status_code == 403
        own = alice.get("/api/v1/users/alice/quota")
        assert own.status_code == 200
        assert own.json()["quota"]["maxSandboxes"] == 100  # the default
    with client(stack, "root") as admin:
        for body in (
            {"maxSandboxes": -1},
            {"maxSandboxes": "lots"},
            {"maxSandboxes": 10**12},
            {"createBurst": 0},
            {"unlimited": True},  # unknown fields are refused, never ignored
            {"maxSandboxes": "\x00"},
        ):
            refused = admin.put("/api/v1/users/bob/quota", json=body)
            assert refused.status_code == 422, (body, refused.text)
            assert refused.json()["code"] == 422
        assert admin.put("/api/v1/users/nobody/quota", json={}).status_code == 404
        for name in ("--ro-bind", "a%00b", "..", "x" * 64):
            assert admin.get(f"/api/v1/users/{name}/quota").status_code in (404, 422), name
    assert httpx.get(f"{stack.api_url}/api/v1/users/bob/quota").status_code == 401
