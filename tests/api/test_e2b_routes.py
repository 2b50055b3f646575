"""The E2B REST surface with a fake lifecycle: shapes, status codes, error bodies, scoping."""

from __future__ import annotations

import base64
import json
from urllib.parse import quote, urlencode

import httpx
import pytest

from services.api.settings import ENVD_VERSION
from tests.api.conftest import ADMIN, ALICE, BOB, auth
from tests.api.fakes import SNAPSHOT_JSON, FakeLifecycle

pytestmark = pytest.mark.unit

SEED_BODY = {
    "templateID": "sandbox-base",
    "timeout": 300,
    "autoPause": True,
    "autoResume": {"enabled": True},
    "metadata": {},
    "envVars": {},
}


async def create(client: httpx.AsyncClient, key: str = ALICE, **body: object) -> dict[str, object]:
    r = await client.post("/v2/sandboxes", json={**SEED_BODY, **body}, headers=auth(key))
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_envd_version_matches_daemon() -> None:
    from services.envd.version import ENVD_VERSION as DAEMON

    assert ENVD_VERSION == DAEMON


async def test_create_returns_201_with_sdk_fields(
    client: httpx.AsyncClient, lifecycle: FakeLifecycle
) -> None:
    body = await create(client)
    assert set(body) >= {"templateID", "sandboxID", "clientID", "envdVersion", "envdAccessToken"}
    assert body["templateID"] == "sandbox-base"
    assert body["envdVersion"] == ENVD_VERSION
    assert body["domain"] == "localhost"  # never null: null would send the SDK to e2b.app
    record = lifecycle.records[str(body["sandboxID"])]
    assert record.auto_pause
    assert record.auto_resume
    assert record.timeout == 300
    assert body["envdAccessToken"] == record.envd_access_token


async def test_create_v1_and_sdk_forms(client: httpx.AsyncClient, lifecycle: FakeLifecycle) -> None:
    r = await client.post("/sandboxes", json={"templateID": "base"}, headers=auth())
    assert r.status_code == 201
    default = lifecycle.records[r.json()["sandboxID"]]
    assert (default.auto_pause, default.auto_resume, default.timeout) == (False, False, 300)
    killer = await create(client, autoPause=False, autoResume={"enabled": False})
    assert not lifecycle.records[str(killer["sandboxID"])].auto_pause
    # the JS SDK / object form
    r = await client.post(
        "/v2/sandboxes",
        json={"templateID": "base", "lifecycle": {"onTimeout": "pause", "autoResume": True}},
        headers=auth(),
    )
    rec = lifecycle.records[r.json()["sandboxID"]]
    assert rec.auto_pause
    assert rec.auto_resume
    assert not rec.auto_pause_memory  # not asked for: a timeout pause keeps files only


@pytest.mark.parametrize(("sent", "kept"), [(True, True), (False, False), (None, False)])
async def test_create_carries_auto_pause_memory(
    client: httpx.AsyncClient, lifecycle: FakeLifecycle, sent: bool | None, kept: bool
) -> None:
    body = await create(client, autoPauseMemory=sent)
    assert lifecycle.records[str(body["sandboxID"])].auto_pause_memory is kept


async def test_resume_sets_auto_pause_when_given(
    client: httpx.AsyncClient, lifecycle: FakeLifecycle
) -> None:
    """E2B's deprecated resume ``autoPause`` is applied, not ignored; absent keeps the setting."""
    sid = str((await create(client, autoPause=True))["sandboxID"])
    for sent, kept in ((False, False), (None, False), (True, True)):
        assert (await client.post(f"/sandboxes/{sid}/pause", headers=auth())).status_code == 204
        body = {} if sent is None else {"autoPause": sent}
        r = await client.post(f"/sandboxes/{sid}/resume", json=body, headers=auth())
        assert r.status_code == 201, r.text
        assert lifecycle.records[sid].auto_pause is kept
    for hostile in ("true", 1, [True]):
        r = await client.post(
            f"/sandboxes/{sid}/resume", json={"autoPause": hostile}, headers=auth()
        )
        assert r.status_code == 400 and "autoPause" in r.json()["message"], r.text


async def test_get_info_maps_state_and_snapshot(client: httpx.AsyncClient) -> None:
    sid = (await create(client, metadata={"k": "v"}))["sandboxID"]
    info = (await client.get(f"/sandboxes/{sid}", headers=auth())).json()
    for key in (
        "templateID",
        "sandboxID",
        "clientID",
        "startedAt",
        "endAt",
        "envdVersion",
        "cpuCount",
        "memoryMB",
        "diskSizeMB",
        "state",
    ):
        assert key in info, key
    assert info["state"] == "running"
    assert info["metadata"] == {"k": "v"}
    assert info["lifecycle"] == {"autoResume": True, "onTimeout": "pause"}

    assert (
        await client.post(f"/sandboxes/{sid}/pause", json={}, headers=auth())
    ).status_code == 204
    info = (await client.get(f"/sandboxes/{sid}", headers=auth())).json()
    assert info["state"] == "paused"
    assert json.loads(base64.b64decode(info["metadata"]["snapshot"])) == SNAPSHOT_JSON
    assert info["metadata"]["k"] == "v"


async def test_pause_twice_is_409_and_connect_resumes_with_201(client: httpx.AsyncClient) -> None:
    sid = (await create(client))["sandboxID"]
    r = await client.post(f"/v2/sandboxes/{sid}/connect", json={}, headers=auth())
    assert r.status_code == 200  # running: TTL extended only
    assert (await client.post(f"/sandboxes/{sid}/pause", headers=auth())).status_code == 204
    r = await client.post(f"/sandboxes/{sid}/pause", json={}, headers=auth())
    assert r.status_code == 409
    assert r.json()["code"] == 409
    assert "already paused" in r.json()["message"]
    r = await client.post(f"/v2/sandboxes/{sid}/connect", json={}, headers=auth())
    assert r.status_code == 201
    assert r.json()["envdAccessToken"]
    # v1 resume of a running sandbox is 409 (E2B semantics); after a pause it is 201
    assert (
        await client.post(f"/sandboxes/{sid}/resume", json={}, headers=auth())
    ).status_code == 409
    await client.post(f"/sandboxes/{sid}/pause", headers=auth())
    r = await client.post(f"/sandboxes/{sid}/resume", json={"timeout": 60}, headers=auth())
    assert r.status_code == 201


async def test_timeout_refresh_and_kill(
    client: httpx.AsyncClient, lifecycle: FakeLifecycle
) -> None:
    sid = str((await create(client))["sandboxID"])
    r = await client.post(f"/sandboxes/{sid}/timeout", json={"timeout": 30}, headers=auth())
    assert r.status_code == 204
    assert lifecycle.records[sid].timeout == 30
    r = await client.post(f"/sandboxes/{sid}/refreshes", json={"duration": 60}, headers=auth())
    assert r.status_code == 204
    r = await client.post(f"/sandboxes/{sid}/timeout", json={"timeout": 10**9}, headers=auth())
    assert r.status_code == 400
    assert r.json()["code"] == 400
    assert (await client.delete(f"/sandboxes/{sid}", headers=auth())).status_code == 204
    r = await client.delete(f"/sandboxes/{sid}", headers=auth())
    assert r.status_code == 404
    assert r.json() == {"code": 404, "message": f"sandbox {sid} not found"}
    assert (await client.get(f"/sandboxes/{sid}", headers=auth())).status_code == 404


async def test_list_filters_and_pagination(client: httpx.AsyncClient) -> None:
    ids = [
        str((await create(client, metadata={"a b": "c&d", "n": str(i)}))["sandboxID"])
        for i in range(5)
    ]
    await create(client, BOB)
    await client.post(f"/sandboxes/{ids[0]}/pause", headers=auth())
    seen: list[str] = []
    token = None
    pages = 0
    while True:
        params = {"state": "running,paused", "limit": "2"}
        if token:
            params["nextToken"] = token
        r = await client.get("/v2/sandboxes", params=params, headers=auth())
        assert r.status_code == 200
        seen += [s["sandboxID"] for s in r.json()]
        pages += 1
        token = r.headers.get("x-next-token")
        if not token:
            break
    assert sorted(seen) == sorted(ids)
    assert pages == 3
    r = await client.get("/v2/sandboxes", params={"state": "paused"}, headers=auth())
    assert [s["sandboxID"] for s in r.json()] == [ids[0]]
    assert r.json()[0]["state"] == "paused"
    # the SDK's double encoding of metadata filters
    meta = urlencode({quote("a b"): quote("c&d"), "n": "3"})
    r = await client.get("/v2/sandboxes", params={"metadata": meta}, headers=auth())
    assert [s["sandboxID"] for s in r.json()] == [ids[3]]
    r = await client.get("/sandboxes", headers=auth())  # v1: running only
    assert len(r.json()) == 4  # v1 lists running sandboxes only, unpaginated


async def test_idempotency_key_returns_the_same_sandbox(
    client: httpx.AsyncClient, lifecycle: FakeLifecycle
) -> None:
    headers = {**auth(), "Idempotency-Key": "retry-1"}
    a = await client.post("/v2/sandboxes", json=SEED_BODY, headers=headers)
    b = await client.post("/v2/sandboxes", json=SEED_BODY, headers=headers)
    assert a.status_code == b.status_code == 201
    assert a.json()["sandboxID"] == b.json()["sandboxID"]
    assert lifecycle.created == 1
    other = await client.post(
        "/v2/sandboxes", json=SEED_BODY, headers={**auth(BOB), "Idempotency-Key": "retry-1"}
    )
    assert other.json()["sandboxID"] != a.json()["sandboxID"]


async def test_no_key_is_401_everywhere(client: httpx.AsyncClient) -> None:
    for method, path in [
        ("POST", "/v2/sandboxes"),
        ("GET", "/v2/sandboxes"),
        ("GET", "/sandboxes/x"),
        ("POST", "/sandboxes/x/pause"),
        ("DELETE", "/sandboxes/x"),
        ("GET", "/api/v1/sandbox"),
        ("POST", "/api/v1/sandbox/pause/x"),
    ]:
        r = await client.request(method, path, json={})
        assert r.status_code == 401, (method, path)
        assert r.json()["code"] == 401
        assert r.json()["message"]
        r = await client.request(method, path, json={}, headers=auth("wrong"))
        assert r.status_code == 401
    r = await client.get("/v2/sandboxes", headers={"Authorization": f"Bearer {ALICE}"})
    assert r.status_code == 200


async def test_other_users_sandbox_is_404_on_every_endpoint(client: httpx.AsyncClient) -> None:
    sid = (await create(client))["sandboxID"]
    calls = [
        ("GET", f"/sandboxes/{sid}", None),
        ("POST", f"/v2/sandboxes/{sid}/connect", {}),
        ("POST", f"/sandboxes/{sid}/connect", {"timeout": 10}),
        ("POST", f"/sandboxes/{sid}/resume", {}),
        ("POST", f"/sandboxes/{sid}/pause", {}),
        ("POST", f"/sandboxes/{sid}/timeout", {"timeout": 10}),
        ("POST", f"/sandboxes/{sid}/refreshes", {}),
        ("GET", f"/sandboxes/{sid}/metrics", None),
        ("GET", f"/sandboxes/{sid}/logs", None),
        ("DELETE", f"/sandboxes/{sid}", None),
        ("GET", f"/api/v1/sandbox/{sid}", None),
        ("POST", f"/api/v1/sandbox/pause/{sid}", None),
        ("POST", f"/api/v1/sandbox/resume/{sid}", None),
        ("DELETE", f"/api/v1/sandbox/{sid}", None),
    ]
    for method, path, body in calls:
        r = await client.request(method, path, json=body, headers=auth(BOB))
        assert r.status_code == 404, (method, path, r.text)
        assert r.json()["code"] == 404
    assert (await client.get("/v2/sandboxes", headers=auth(BOB))).json() == []
    # still there for its owner, and visible to an admin
    assert (await client.get(f"/sandboxes/{sid}", headers=auth())).status_code == 200
    assert (await client.get(f"/sandboxes/{sid}", headers=auth(ADMIN))).status_code == 200


async def test_error_bodies_are_json(client: httpx.AsyncClient) -> None:
    r = await client.get("/nope", headers=auth())
    assert r.status_code == 404
    assert r.json()["code"] == 404
    r = await client.put("/v2/sandboxes", headers=auth())
    assert r.status_code == 405
    assert r.json()["code"] == 405
    r = await client.post("/v2/sandboxes", json={"timeout": "soon"}, headers=auth())
    assert r.status_code == 400
    assert "timeout" in r.json()["message"]
    r = await client.post(
        "/v2/sandboxes",
        content=b"{not json",
        headers={**auth(), "content-type": "application/json"},
    )
    assert r.status_code == 400
    r = await client.get("/sandboxes/NOT_VALID", headers=auth())
    assert r.status_code == 404


async def test_correlation_id_is_echoed_and_metrics_are_served(client: httpx.AsyncClient) -> None:
    r = await client.get("/v2/sandboxes", headers={**auth(), "X-Correlation-Id": "abc-123"})
    assert r.headers["x-correlation-id"] == "abc-123"
    r = await client.get("/v2/sandboxes", headers=auth())
    assert len(r.headers["x-correlation-id"]) == 32
    metrics = (await client.get("/metrics")).text
    assert (
        'torpor_api_http_requests_total{method="GET",route="/v2/sandboxes",status="200"}' in metrics
    )
    assert (await client.get("/health")).status_code == 200


async def test_keys_never_logged(
    client: httpx.AsyncClient, capsys: pytest.CaptureFixture[str]
) -> None:
    import logging

    import structlog

    from shared.logging import configure
    from shared.settings import LoggingSettings

    configure(LoggingSettings(log_level="debug", log_format="json"), service="api")
    # Module-level loggers must not keep capsys's stream once this test is over.
    structlog.configure(cache_logger_on_first_use=False)
    try:
        sid = (await create(client))["sandboxID"]
        await client.get(f"/sandboxes/{sid}", headers={"Authorization": f"Bearer {ALICE}"})
        await client.get("/v2/sandboxes", headers=auth("torpor_wrong_secret"))
        await client.post("/v2/sandboxes", json={"timeout": "x"}, headers=auth())
    finally:
        structlog.reset_defaults()
        logging.getLogger().handlers.clear()
    err = capsys.readouterr().err
    assert "http_request" in err
    assert '"user": "alice"' in err
    for secret in (ALICE, "torpor_wrong_secret"):
        assert secret not in err


@pytest.mark.parametrize(
    ("hooks", "where"),
    [
        ({"prePause": {"command": "sync\u0000rm -rf /"}}, "hooks.prePause.command"),
        ({"prePause": {"command": "x" * 5000}}, "hooks.prePause.command"),
        ({"postResume": {"command": "ok", "timeout": 86400}}, "hooks.postResume.timeout"),
        ({"preKill": {"command": "ok", "onFailure": "abort"}}, "hooks"),
        ({"prePause": {"command": "ok", "user": "root"}}, "hooks.prePause.user"),
    ],
)
async def test_hostile_hooks_are_400_naming_the_field(
    client: httpx.AsyncClient, hooks: dict[str, object], where: str
) -> None:
    r = await client.post("/v2/sandboxes", json={**SEED_BODY, "hooks": hooks}, headers=auth())
    assert r.status_code == 400 and where in r.json()["message"], r.text
    native = await client.post("/api/v1/sandbox", json={"hooks": hooks}, headers=auth())
    assert native.status_code == 422 and where in native.json()["message"], native.text
    assert "rm -rf" not in r.text  # the value is not echoed


async def test_a_refused_pause_is_409_with_the_hook_outcome(
    client: httpx.AsyncClient, lifecycle: FakeLifecycle, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shared.errors import PauseRefused

    sid = (await create(client))["sandboxID"]
    hook = {"hook": "prePause", "source": "sandbox", "exit_code": 3, "aborted": True}

    async def refuse(sandbox_id: str, **_: object) -> None:
        raise PauseRefused(f"sandbox {sandbox_id} keeps running: hook failed", hook=hook)

    monkeypatch.setattr(lifecycle, "pause", refuse)
    r = await client.post(f"/sandboxes/{sid}/pause", json={}, headers=auth())
    assert r.status_code == 409 and r.json()["hook"] == hook
    assert r.json()["code"] == 409 and "keeps running" in r.json()["message"]


async def test_pause_carries_memory_and_refuses_anything_but_a_bool(
    client: httpx.AsyncClient, lifecycle: FakeLifecycle, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = (await create(client))["sandboxID"]
    asked: list[object] = []
    pause = lifecycle.pause

    async def recording(sandbox_id: str, **kw: object) -> object:
        asked.append(kw.get("memory"))
        return await pause(sandbox_id, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(lifecycle, "pause", recording)
    for body in ({"memory": "true"}, {"memory": 1}, {"memory": None}, {"memory": True, "x": 1}):
        r = await client.post(f"/sandboxes/{sid}/pause", json=body, headers=auth())
        assert r.status_code == 400 and r.json()["code"] == 400, (body, r.text)
    assert asked == []
    for body, memory in (({"memory": True}, True), ({}, False), (None, False)):
        r = await client.post(f"/sandboxes/{sid}/pause", json=body, headers=auth())
        assert r.status_code == 204, r.text
        assert (
            await client.post(f"/v2/sandboxes/{sid}/connect", json={}, headers=auth())
        ).status_code == 201
    assert asked == [True, False, False]
