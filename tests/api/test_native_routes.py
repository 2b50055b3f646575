"""The native REST API (the seed's pause/resume plus create/get/list/delete)."""

from __future__ import annotations

import base64
import json

import httpx
import pytest

from tests.api.conftest import ALICE, BOB
from tests.api.fakes import SNAPSHOT_JSON

pytestmark = pytest.mark.unit


def bearer(key: str = ALICE) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_create_pause_get_resume_delete(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/api/v1/sandbox",
        json={"name": "sandbox-01", "timeout": 300, "autoPause": True, "autoResume": True},
        headers=bearer(),
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["name"] == "sandbox-01"
    assert body["state"] == "running"
    assert body["snapshot"] is None
    assert body["autoPause"] is True
    assert body["autoResume"] is True

    r = await client.post("/api/v1/sandbox/pause/sandbox-01", headers=bearer())
    assert r.status_code == 200
    assert r.json()["state"] == "paused"
    r = await client.post("/api/v1/sandbox/pause/sandbox-01", headers=bearer())
    assert r.status_code == 409
    assert r.json()["code"] == 409

    got = (await client.get("/api/v1/sandbox/sandbox-01", headers=bearer())).json()
    assert got["state"] == "paused"
    assert got["retainUntil"]
    assert got["pausedAt"]
    assert json.loads(base64.b64decode(got["snapshot"]["annotation"])) == SNAPSHOT_JSON
    assert got["snapshot"]["processCount"] == 1

    r = await client.post("/api/v1/sandbox/resume/sandbox-01", headers=bearer())
    assert r.status_code == 200
    assert r.json()["state"] == "running"
    assert r.json()["snapshot"] is not None  # the last snapshot stays visible after a resume
    r = await client.post("/api/v1/sandbox/resume/sandbox-01", headers=bearer())
    assert r.status_code == 409

    listed = (await client.get("/api/v1/sandbox", headers=bearer())).json()["sandboxes"]
    assert [s["name"] for s in listed] == ["sandbox-01"]
    assert (await client.get("/api/v1/sandbox", headers=bearer(BOB))).json() == {"sandboxes": []}

    assert (await client.delete("/api/v1/sandbox/sandbox-01", headers=bearer())).status_code == 204
    r = await client.get("/api/v1/sandbox/sandbox-01", headers=bearer())
    assert r.status_code == 404
    assert r.json() == {
        "code": 404,
        "message": "sandbox sandbox-01 not found",
    }


async def test_invalid_names_are_422_unknown_are_404(client: httpx.AsyncClient) -> None:
    for path in ("/api/v1/sandbox/pause/Bad_Name", "/api/v1/sandbox/resume/-x"):
        r = await client.post(path, headers=bearer())
        assert r.status_code == 422, path
        assert r.json()["code"] == 422
        assert "name" in r.json()["message"]
    r = await client.post("/api/v1/sandbox", json={"name": "UPPER"}, headers=bearer())
    assert r.status_code == 422
    r = await client.post("/api/v1/sandbox/pause/ghost", headers=bearer())
    assert r.status_code == 404
    assert r.json()["code"] == 404
    r = await client.post("/api/v1/sandbox", json={"timeout": 0}, headers=bearer())
    assert r.status_code == 422


async def test_names_are_per_user(client: httpx.AsyncClient) -> None:
    mine = (await client.post("/api/v1/sandbox", json={"name": "dup"}, headers=bearer())).json()
    # Bob may use the same name: another sandbox, and nothing says Alice has one.
    r = await client.post("/api/v1/sandbox", json={"name": "dup"}, headers=bearer(BOB))
    assert r.status_code == 201
    assert r.json()["name"] == "dup"
    assert r.json()["sandboxId"] != mine["sandboxId"]
    # Twice the same name for one user is a conflict, about the caller's own sandbox.
    r = await client.post("/api/v1/sandbox", json={"name": "dup"}, headers=bearer())
    assert r.status_code == 409
    assert r.json()["code"] == 409
    # Each sees their own under that name; the id works too, only for its owner.
    got = (await client.get("/api/v1/sandbox/dup", headers=bearer())).json()
    assert got["sandboxId"] == mine["sandboxId"]
    assert got["owner"] == "alice"
    r = await client.get(f"/api/v1/sandbox/{mine['sandboxId']}", headers=bearer(BOB))
    assert r.status_code == 404


async def test_openapi_describes_both_apis(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    paths = spec["paths"]
    for path in (
        "/v2/sandboxes",
        "/sandboxes",
        "/sandboxes/{sandbox_id}",
        "/v2/sandboxes/{sandbox_id}/connect",
        "/sandboxes/{sandbox_id}/pause",
        "/api/v1/sandbox",
        "/api/v1/sandbox/{name}",
        "/api/v1/sandbox/pause/{name}",
        "/api/v1/sandbox/resume/{name}",
        "/events/sandboxes",
        "/events/sandboxes/{sandbox_id}",
    ):
        assert path in paths, path
    schemes = spec["components"]["securitySchemes"]
    assert {s["type"] for s in schemes.values()} >= {"apiKey", "http"}
    created = paths["/v2/sandboxes"]["post"]["responses"]
    assert "201" in created
    assert "200" not in created
