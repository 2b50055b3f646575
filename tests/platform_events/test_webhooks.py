"""Webhooks and the usage ledger on the real system (services as processes, bubblewrap pods, a loopback receiver):
every event of create → pause → resume → kill arrives, signed, under its stable id, through a
kill -9 of the deliverer and a receiver outage; a dead receiver's deliveries are dead-lettered
with the reason; other users' events never reach a webhook; hostile registrations are refused,
the control plane's own ports included although loopback receivers are allowed here. The usage
of a scripted scenario equals what its events' timestamps say, through a kill -9 of the
ledger."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import nats
import pytest
from e2b import Sandbox

from shared.bus.server import free_port, free_ports
from shared.bus.topology import STREAM_DLQ
from shared.webhooks.signing import verify
from tests.platform_events.receiver import Receiver
from tests.support.fixtures import started
from tests.support.stack import SEED_TEMPLATE, SERVICES, Stack
from tests.support.waiting import until

pytestmark = pytest.mark.e2e  # the whole system as processes (its fixture is not ``stack``)

LIFECYCLE = [f"sandbox.lifecycle.{t}" for t in ("created", "paused", "resumed", "killed")]
MAX_ATTEMPTS = 8


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Receiver]]:
    receiver = Receiver()
    receiver.start()
    stack = Stack(
        tmp_path_factory.mktemp("webhooks"),
        services=(*SERVICES, "deliverer", "ledger"),
        fast_redelivery=True,
        templates={"sandbox-base": SEED_TEMPLATE},
        env_of={
            "deliverer": {
                "TORPOR_DELIVERER_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
                "TORPOR_TUNING": "DELIVERER_BACKOFF_BASE_SECONDS=0.5,"
                "DELIVERER_BACKOFF_CAP_SECONDS=2",
            }
        },
    )
    api, proxy = free_ports(2, avoid=stack.ports.values())
    stack.ports |= {"api": api, "proxy": proxy}
    stack.env |= {
        # Loopback receivers are allowed here (tests may only reach 127.0.0.0/8); the control
        # plane's own ports on it must stay refused.
        "TORPOR_WEBHOOKS_ALLOW_CIDRS": "127.0.0.0/8",
        "TORPOR_WEBHOOKS_EXTRA_CONTROL_PORTS": f"{stack.ports['api']},{stack.ports['proxy']}",
    }
    try:
        for running in started(stack):
            yield running, receiver
    finally:
        receiver.stop()


def register(stack: Stack, user: str, url: str, events: list[str]) -> dict[str, Any]:
    with stack.client(user) as api:
        r = api.post(
            "/events/webhooks", json={"name": f"{user} hook", "url": url, "events": events}
        )
    assert r.status_code == 201, r.text
    return dict(r.json())


def deliveries(stack: Stack, user: str, hook_id: str) -> list[dict[str, Any]]:
    with stack.client(user) as api:
        r = api.get(f"/events/webhooks/{hook_id}/deliveries")
    assert r.status_code == 200, r.text
    return list(r.json())


def lifecycle_events(stack: Stack, user: str, sandbox_id: str) -> list[dict[str, Any]]:
    """The sandbox's lifecycle events from the API, oldest first."""
    with stack.client(user) as api:
        r = api.get(
            f"/events/sandboxes/{sandbox_id}",
            params=[("types", t) for t in LIFECYCLE] + [("orderAsc", "true")],
        )
    return list(r.json())


def of_sandbox(receiver: Receiver, path: str, sandbox_id: str) -> list[Any]:
    return [r for r in receiver.on(path) if json.loads(r.body)["sandboxId"] == sandbox_id]


async def dead_letter_of(nats_url: str, sandbox_id: str) -> dict[str, Any]:
    nc = await nats.connect(nats_url)
    try:
        msg = await nc.jetstream().get_msg(
            STREAM_DLQ, subject=f"sandbox.dlq.deliverer-send.{sandbox_id}"
        )
        return dict(json.loads(msg.data))
    finally:
        await nc.close()


def test_every_event_once_signed_through_a_crash_and_an_outage(
    system: tuple[Stack, Receiver],
) -> None:
    stack, receiver = system
    main = register(stack, "alice", receiver.url("/alice"), LIFECYCLE)
    secret = main["signatureSecret"]
    gone = register(stack, "alice", f"http://127.0.0.1:{free_port()}/gone", LIFECYCLE[-1:])
    register(stack, "bob", receiver.url("/bob"), LIFECYCLE)

    sbx = Sandbox.create(template="sandbox-base", timeout=300, **stack.sdk_opts("alice"))
    sid = sbx.sandbox_id
    until(lambda: of_sandbox(receiver, "/alice", sid), 60, "the created delivery")

    stack.kill9("deliverer")  # its durables keep what it has not acked
    receiver.stop()  # and the receiver is down: connections refused
    assert sbx.pause() is True
    sbx = Sandbox.connect(sid, timeout=300, **stack.sdk_opts("alice"))  # resumes it
    stack.start_service("deliverer")
    asyncio.run(stack.wait_ready("deliverer"))
    until(
        lambda: any(d["state"] == "retrying" for d in deliveries(stack, "alice", main["id"])),
        60,
        "a failed attempt against the receiver that is down",
        every=0.2,
    )
    receiver.start()
    sbx.kill()

    listed = lifecycle_events(stack, "alice", sid)
    expected = [e["id"] for e in listed]
    assert [e["type"] for e in listed] == LIFECYCLE, listed
    until(
        lambda: (
            {json.loads(r.body)["id"] for r in of_sandbox(receiver, "/alice", sid)} >= set(expected)
        ),
        90,
        "every lifecycle event at the receiver",
    )
    got = of_sandbox(receiver, "/alice", sid)
    by_id: dict[str, set[bytes]] = {}
    for r in got:
        body = json.loads(r.body)
        assert r.headers["torpor-event-id"] == body["id"]
        assert r.headers["torpor-webhook-id"] == main["id"]
        verify(secret, r.headers["torpor-signature"], r.body, now=int(time.time()), tolerance=600)
        by_id.setdefault(body["id"], set()).add(r.body)
    assert sorted(by_id) == sorted(expected)  # nothing lost, nothing else
    assert all(len(bodies) == 1 for bodies in by_id.values())  # a redelivery is the same body
    assert of_sandbox(receiver, "/bob", sid) == []  # bob's webhook never sees alice's sandbox

    history = {d["eventId"]: d for d in deliveries(stack, "alice", main["id"])}
    assert {history[i]["state"] for i in expected} == {"delivered"}

    # The dead receiver: dead-lettered after the limit, with the reason, in history and DLQ.
    dead = until(
        lambda: [
            d for d in deliveries(stack, "alice", gone["id"]) if d["state"] == "dead_lettered"
        ],
        90,
        "the dead receiver's delivery dead-lettered",
    )
    assert dead[0]["attempts"] == MAX_ATTEMPTS
    assert "connection failed" in dead[0]["lastError"]
    letter = asyncio.run(dead_letter_of(stack.nats_url, sid))
    assert letter["webhook_id"] == gone["id"] and "connection failed" in letter["reason"]

    logs = stack.all_logs()
    assert secret not in logs and secret not in json.dumps(letter)
    with stack.client("alice") as api:
        assert secret not in api.get("/events/webhooks").text
        assert secret not in api.get(f"/events/sandboxes/{sid}").text


HOSTILE_URLS = [
    "file:///etc/passwd",
    "gopher://127.0.0.1:70/_stats",
    "http://127.0.0.1:9/\x00",
    "http://user:pw@127.0.0.1:9999/",
    "http://169.254.169.254/latest/meta-data/",
    "http://10.0.0.1/",
    "http://[::ffff:10.0.0.1]/",
    "--ro-bind",
    "http://127.0.0.1:9999/" + "a" * 5000,
]


def test_hostile_registrations(system: tuple[Stack, Receiver]) -> None:
    stack, receiver = system
    api_port, proxy_port = stack.ports["api"], stack.ports["proxy"]
    refused = [
        *HOSTILE_URLS,
        # the control plane's own ports, although loopback receivers are allowed here
        f"http://127.0.0.1:{api_port}/events/webhooks",
        f"http://localhost:{api_port}/",
        f"http://127.0.0.2:{proxy_port}/",
        f"http://[::ffff:127.0.0.1]:{api_port}/",
        "http://127.0.0.1:49983/",  # envd
        "http://127.0.0.1:4222/",  # NATS
    ]
    with stack.client("alice") as api:
        for url in refused:
            r = api.post("/events/webhooks", json={"url": url, "events": LIFECYCLE})
            assert r.status_code == 400, (url, r.text)
            assert r.json()["message"].startswith("url"), r.text
        for body, field in [
            ({"url": receiver.url(), "events": ["sandbox.lifecycle.nope"]}, "events"),
            ({"url": receiver.url(), "events": []}, "events"),
            ({"url": receiver.url(), "events": LIFECYCLE, "retries": 99}, "retries"),
            ({"url": receiver.url(), "events": LIFECYCLE, "name": "x\x00y"}, "name"),
            (
                {"url": receiver.url(), "events": LIFECYCLE, "signatureSecret": "x"},
                "signatureSecret",
            ),
        ]:
            r = api.post("/events/webhooks", json=body)
            assert r.status_code == 400, (body, r.text)
            assert field in r.json()["message"], r.text
        huge = api.post(
            "/events/webhooks",
            content=b'{"url": "' + b"a" * (2 << 20) + b'"}',
            headers={"Content-Type": "application/json"},
        )
        assert huge.status_code == 413
        mine = api.post("/events/webhooks", json={"url": receiver.url("/x"), "events": LIFECYCLE})
        assert mine.status_code == 201
        hook_id = mine.json()["id"]
        assert mine.json()["signatureSecret"].startswith("whsec_")
        shown = api.get(f"/events/webhooks/{hook_id}").json()
        assert "signatureSecret" not in shown and shown["teamId"] == "alice"
        r = api.patch(f"/events/webhooks/{hook_id}", json={"url": f"http://127.0.0.1:{api_port}/"})
        assert r.status_code == 400
        r = api.patch(f"/events/webhooks/{hook_id}", json={"enabled": False})
        assert r.status_code == 200 and r.json()["enabled"] is False
    with stack.client("bob") as bob:
        for method, path in [
            ("GET", f"/events/webhooks/{hook_id}"),
            ("PATCH", f"/events/webhooks/{hook_id}"),
            ("DELETE", f"/events/webhooks/{hook_id}"),
            ("GET", f"/events/webhooks/{hook_id}/deliveries"),
            ("GET", "/events/webhooks/--ro-bind"),
            ("GET", "/events/webhooks/wh-..%2F..%2Fx"),
        ]:
            r = bob.request(method, path, json={"enabled": True} if method == "PATCH" else None)
            assert r.status_code == 404, (method, path, r.text)
        assert hook_id not in bob.get("/events/webhooks").text
    with stack.client("alice") as api:
        assert api.delete(f"/events/webhooks/{hook_id}").status_code == 204
        assert api.get(f"/events/webhooks/{hook_id}").status_code == 404
    assert httpx.get(stack.api_url + "/events/webhooks").status_code == 401


def test_usage_of_a_scripted_scenario_matches_its_event_timestamps(
    system: tuple[Stack, Receiver],
) -> None:
    stack, _ = system
    sbx = Sandbox.create(template="sandbox-base", timeout=300, **stack.sdk_opts("alice"))
    sid = sbx.sandbox_id
    stack.kill9("ledger")  # events keep coming; its durable keeps them
    assert sbx.pause() is True
    stack.start_service("ledger")
    asyncio.run(stack.wait_ready("ledger"))
    sbx = Sandbox.connect(sid, timeout=300, **stack.sdk_opts("alice"))
    sbx.kill()

    listed = lifecycle_events(stack, "alice", sid)
    with stack.client("alice") as api:
        at = {e["type"].rsplit(".", 1)[1]: datetime.fromisoformat(e["timestamp"]) for e in listed}
        assert len(at) == 4, listed

        def stopped() -> dict[str, Any] | None:
            r = api.get(f"/api/v1/usage/sandboxes/{sid}")
            return r.json() if r.status_code == 200 and r.json()["state"] == "stopped" else None

        usage = until(stopped, 60, "the ledger to see the kill")
        mine = api.get("/api/v1/usage").json()
    running = (at["paused"] - at["created"]) + (at["killed"] - at["resumed"])
    paused = at["resumed"] - at["paused"]
    assert usage["runningSeconds"] == pytest.approx(running.total_seconds(), abs=1e-3)
    assert usage["pausedSeconds"] == pytest.approx(paused.total_seconds(), abs=1e-3)
    assert usage["cpuSeconds"] == pytest.approx(usage["runningSeconds"] * usage["cpuCount"])
    assert usage["keptByteSeconds"] == pytest.approx(usage["pausedSeconds"] * usage["keptBytes"])
    assert (usage["resumes"], usage["replayFailures"]) == (1, 0)
    assert sid in {s["sandboxId"] for s in mine["sandboxes"]}
    assert mine["totals"]["runningSeconds"] >= usage["runningSeconds"]

    with stack.client("bob") as bob:
        assert bob.get(f"/api/v1/usage/sandboxes/{sid}").status_code == 404
        assert bob.get("/api/v1/usage", params={"user": "alice"}).status_code == 403
        assert sid not in bob.get("/api/v1/usage").text
    metrics = httpx.get(stack.url("ledger") + "/metrics").text
    assert 'torpor_usage_running_seconds{user="alice"}' in metrics
