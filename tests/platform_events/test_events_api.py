"""The events API (``GET /events/sandboxes[/{id}]``) over a real nats-server: the event stream
read back through short-lived consumers, owner-scoped by the records, E2B's shape and paging,
the time and type filters, and hostile parameters."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from services.api.app import create_app
from services.api.deps import Wiring
from services.api.settings import ApiSettings
from shared.bus.event_log import NatsEventLog
from shared.lifecycle.event_query import EventQuery
from shared.models.messages import (
    ProcessOutcome,
    SandboxActivity,
    SandboxCreated,
    SandboxFailed,
    SandboxKilled,
    SandboxPaused,
    SandboxResumed,
    SandboxSnapshotted,
    SandboxTimeoutSet,
)
from tests.api.conftest import ADMIN, ALICE, BOB, auth
from tests.api.fakes import FakeKeys, FakeLifecycle
from tests.platform_events.bus import Bus, bus

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def sid(tag: str) -> str:
    return f"ev-{tag}-{secrets.token_hex(4)}"


@pytest.fixture
async def wired(nats_url: str) -> AsyncIterator[tuple[Bus, httpx.AsyncClient]]:
    async with bus(nats_url) as b:
        keys = FakeKeys()
        keys.add(ALICE, "alice")
        keys.add(BOB, "bob")
        keys.add(ADMIN, "root", admin=True)
        settings = ApiSettings()
        js = b.broker.config.connection_state.stream
        wiring = Wiring(
            settings=settings,
            lifecycle=FakeLifecycle(),
            keys=keys,
            events=EventQuery(NatsEventLog(js, service="test"), b.store),
        )
        app = create_app(settings, wiring=wiring)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            yield b, client


async def lifecycle_of(b: Bus, sandbox_id: str, owner: str, start: datetime = T0) -> None:
    await b.sandbox(sandbox_id, owner)
    at = start
    await b.emit(
        SandboxCreated(sandbox_id=sandbox_id, generation=1, at=at),
        SandboxActivity(sandbox_id=sandbox_id, generation=1, at=at + timedelta(seconds=1)),
        SandboxTimeoutSet(
            sandbox_id=sandbox_id, generation=1, at=at + timedelta(seconds=2), deadline=at
        ),
        SandboxSnapshotted(
            sandbox_id=sandbox_id,
            generation=1,
            at=at + timedelta(seconds=3),
            snapshot_id="s1",
            process_count=1,
        ),
        SandboxPaused(sandbox_id=sandbox_id, generation=2, at=at + timedelta(seconds=4)),
        SandboxResumed(
            sandbox_id=sandbox_id,
            generation=3,
            at=at + timedelta(seconds=5),
            processes=[ProcessOutcome(cmd="sleep", args=["9"], old_pid=7, new_pid=9)],
        ),
        SandboxKilled(sandbox_id=sandbox_id, generation=4, at=at + timedelta(seconds=6)),
    )


async def test_one_sandbox_in_e2b_shape_newest_first(
    wired: tuple[Bus, httpx.AsyncClient],
) -> None:
    b, client = wired
    s = sid("one")
    await lifecycle_of(b, s, "alice")
    r = await client.get(f"/events/sandboxes/{s}", headers=auth(ALICE))
    assert r.status_code == 200, r.text
    events = r.json()
    assert [e["type"] for e in events] == [
        "sandbox.lifecycle.killed",
        "sandbox.lifecycle.resumed",
        "sandbox.lifecycle.paused",
        "sandbox.lifecycle.updated",
        "sandbox.lifecycle.created",
    ]  # no internal facts (activity, snapshotted)
    killed, resumed, _, updated, created = events
    assert created["id"] == f"created:{s}:g1" and killed["id"] == f"killed:{s}:g4"
    assert created["version"] == "v1"
    assert created["sandboxId"] == s and created["sandboxTeamId"] == "alice"
    assert created["sandboxTemplateId"] == "sandbox-base"
    assert created["timestamp"].startswith("2026-11-30T12:00:00")
    assert updated["eventData"]["set_timeout"].startswith("2026-11-30T12:00:00")
    assert resumed["eventData"]["processes"][0]["new_pid"] == 9
    assert "s3cr3t" not in r.text and "envd-token" not in r.text

    asc = await client.get(
        f"/events/sandboxes/{s}",
        params={"orderAsc": "true", "limit": 2, "offset": 1},
        headers=auth(ALICE),
    )
    assert [e["type"] for e in asc.json()] == [
        "sandbox.lifecycle.updated",
        "sandbox.lifecycle.paused",
    ]
    typed = await client.get(
        f"/events/sandboxes/{s}",
        params=[("types", "sandbox.lifecycle.paused"), ("types", "sandbox.lifecycle.killed")],
        headers=auth(ALICE),
    )
    assert [e["type"] for e in typed.json()] == [
        "sandbox.lifecycle.killed",
        "sandbox.lifecycle.paused",
    ]


async def test_owner_scoped(wired: tuple[Bus, httpx.AsyncClient]) -> None:
    b, client = wired
    mine, theirs = sid("mine"), sid("theirs")
    await lifecycle_of(b, mine, "alice")
    await lifecycle_of(b, theirs, "bob")
    r = await client.get(f"/events/sandboxes/{theirs}", headers=auth(ALICE))
    assert r.status_code == 404 and r.json()["code"] == 404
    unknown = await client.get(f"/events/sandboxes/{sid('nobody')}", headers=auth(ALICE))
    assert unknown.status_code == 404
    listed = await client.get("/events/sandboxes", params={"limit": 100}, headers=auth(ALICE))
    assert listed.status_code == 200
    ids = {e["sandboxId"] for e in listed.json()}
    assert mine in ids and theirs not in ids
    assert {e["sandboxTeamId"] for e in listed.json()} == {"alice"}
    admin = await client.get(f"/events/sandboxes/{theirs}", headers=auth(ADMIN))
    assert admin.status_code == 200 and len(admin.json()) == 5


async def test_user_list_time_and_type_filters(wired: tuple[Bus, httpx.AsyncClient]) -> None:
    b, client = wired
    early, late = sid("early"), sid("late")
    await lifecycle_of(b, early, "carol", start=T0)
    await lifecycle_of(b, late, "carol", start=T0 + timedelta(hours=1))
    b_keys = client  # carol needs a key
    keys = b_keys._transport.app.state.wiring.keys  # type: ignore[attr-defined]
    keys.add("torpor_carol_key", "carol")
    carol = {"X-API-KEY": "torpor_carol_key"}
    everything = await client.get("/events/sandboxes", params={"limit": 100}, headers=carol)
    assert len(everything.json()) == 10
    window = await client.get(
        "/events/sandboxes",
        params={
            "since": (T0 + timedelta(minutes=30)).isoformat(),
            "until": (T0 + timedelta(hours=1, seconds=4)).isoformat(),
            "orderAsc": "true",
            "limit": 100,
        },
        headers=carol,
    )
    assert [(e["sandboxId"], e["type"].rsplit(".", 1)[1]) for e in window.json()] == [
        (late, "created"),
        (late, "updated"),
        (late, "paused"),
    ]
    created = await client.get(
        "/events/sandboxes",
        params={"types": "sandbox.lifecycle.created", "limit": 1},
        headers=carol,
    )
    assert [e["sandboxId"] for e in created.json()] == [late]  # newest first, one page
    page2 = await client.get(
        "/events/sandboxes",
        params={"types": "sandbox.lifecycle.created", "limit": 1, "offset": 1},
        headers=carol,
    )
    assert [e["sandboxId"] for e in page2.json()] == [early]


async def test_failed_reason_is_masked(wired: tuple[Bus, httpx.AsyncClient]) -> None:
    b, client = wired
    s = sid("fail")
    await b.sandbox(s, "alice")
    await b.emit(
        SandboxFailed(
            sandbox_id=s, generation=1, at=T0, op="pause", reason="envd said password=abcd1234xyz"
        )
    )
    r = await client.get(f"/events/sandboxes/{s}", headers=auth(ALICE))
    assert r.json()[0]["type"] == "sandbox.lifecycle.failed"
    assert "abcd1234xyz" not in r.text


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"types": "sandbox.lifecycle.nope"}, "types"),
        ({"types": "sandbox.lifecycle.created\x00"}, "types"),
        ({"limit": 101}, "limit"),
        ({"limit": 0}, "limit"),
        ({"offset": -1}, "offset"),
        ({"since": "yesterday"}, "since"),
        ({"since": "2026-11-30T12:00:00Z", "until": "2026-11-30T11:00:00Z"}, "until"),
        ({"types": ["sandbox.lifecycle.created"] * 17}, "types"),
    ],
)
async def test_hostile_parameters_are_400_naming_the_field(
    wired: tuple[Bus, httpx.AsyncClient], params: dict[str, object], field: str
) -> None:
    _, client = wired
    r = await client.get("/events/sandboxes", params=params, headers=auth(ALICE))  # type: ignore[arg-type]
    assert r.status_code == 400, r.text
    assert field in r.json()["message"]


@pytest.mark.parametrize("bad", ["--ro-bind", "a" * 64, "UPPER", "x%00y", "..%2F..", "a.b"])
async def test_hostile_sandbox_ids_are_404(wired: tuple[Bus, httpx.AsyncClient], bad: str) -> None:
    _, client = wired
    r = await client.get(f"/events/sandboxes/{bad}", headers=auth(ALICE))
    assert r.status_code in (400, 404), r.text


async def test_unauthenticated_is_401(wired: tuple[Bus, httpx.AsyncClient]) -> None:
    _, client = wired
    assert (await client.get("/events/sandboxes")).status_code == 401
