"""The template API's input rules, fast tier (the API app with an in-memory template store):
unknown fields, NUL bytes, option-looking names, huge values, images the runtime cannot build
on, other tenants' ids, forged or altered upload URLs. The SDK end to end: test_build.py."""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.api.app import create_app
from services.api.deps import Wiring
from services.api.settings import ApiSettings
from services.api.template_builds import TemplateBuilds
from services.api.uploads import Grant, UploadSigner
from tests.api.fakes import FakeKeys, FakeLifecycle
from tests.fakes.publisher import RecordingPublisher
from tests.fakes.templates import FakeTemplateStore

pytestmark = pytest.mark.unit

KEYS = {"alice": "key-alice", "bob": "key-bob", "admin": "key-admin"}


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, TemplateBuilds]]:
    keys = FakeKeys()
    for user, key in KEYS.items():
        keys.add(key, user, admin=user == "admin")
    builds = TemplateBuilds(
        store=FakeTemplateStore(),
        publisher=RecordingPublisher(),
        blobs=tmp_path / "blobs",
        signer_key=b"k" * 32,
        max_upload_bytes=64 * 1024,
        max_concurrent_builds=1,
        max_templates=3,
    )
    cfg = ApiSettings()
    app = create_app(
        cfg, wiring=Wiring(settings=cfg, lifecycle=FakeLifecycle(), keys=keys, builds=builds)
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        yield client, builds


def _as(user: str) -> dict[str, str]:
    return {"X-API-KEY": KEYS[user]}


async def _new(c: httpx.AsyncClient, name: str = "app", user: str = "alice") -> dict[str, Any]:
    r = await c.post("/v3/templates", json={"name": name}, headers=_as(user))
    assert r.status_code == 202, r.text
    return dict(r.json())


def _archive(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "app", "surprise": 1}, "surprise"),
        ({"name": "app", "teamID": "team-1"}, "teamID"),
        ({"name": "app", "minFreeDiskMb": 100}, "minFreeDiskMb"),
        ({"name": "app", "memoryMB": 10**9}, "memoryMB"),
        ({"name": "a\x00b"}, "name"),
        ({"name": "--ro-bind"}, "name"),
        ({"name": "../../etc"}, "name"),
        ({"name": "x" * 500}, "name"),
        ({"name": "app", "tags": ["--privileged"]}, "tags"),
        ({}, "name"),
    ],
)
async def test_bad_create_requests_are_400_naming_the_field(
    api: tuple[httpx.AsyncClient, TemplateBuilds], body: dict[str, Any], field: str
) -> None:
    c, _ = api
    r = await c.post("/v3/templates", json=body, headers=_as("alice"))
    assert r.status_code == 400, r.text
    assert field in r.json()["message"]


@pytest.mark.parametrize(
    ("start", "field"),
    [
        ({"fromImage": "ubuntu:22.04"}, "fromImage"),
        (
            {"fromImage": "debian:stable", "fromImageRegistry": {"type": "registry"}},
            "fromImageRegistry",
        ),
        ({}, "fromImage"),
        ({"fromTemplate": "nope-not-there"}, "fromTemplate"),
        ({"fromImage": "debian", "steps": [{"type": "ADD", "args": ["x"]}]}, "type"),
        ({"fromImage": "debian", "steps": [{"type": "RUN", "args": ["a\x00b"]}]}, "args"),
        ({"fromImage": "debian", "steps": [{"type": "RUN", "args": ["x" * 70000]}]}, "args"),
        ({"fromImage": "debian", "steps": [{"type": "RUN", "args": ["true"]}] * 201}, "steps"),
        ({"fromImage": "debian", "steps": [{"type": "USER", "args": ["--ro-bind"]}]}, "args"),
        ({"fromImage": "debian", "steps": [{"type": "ENV", "args": ["A-B", "1"]}]}, "args"),
        (
            {
                "fromImage": "debian",
                "steps": [{"type": "COPY", "args": ["a", "/b"], "filesHash": "0" * 64}],
            },
            "filesHash",
        ),
        (
            {
                "fromImage": "debian",
                "steps": [{"type": "COPY", "args": ["a", "/b"], "filesHash": "../x"}],
            },
            "filesHash",
        ),
        ({"fromImage": "debian", "startCmd": "a\x00"}, "startCmd"),
        ({"fromImage": "debian", "unknown": True}, "unknown"),
    ],
)
async def test_bad_build_starts_are_400_naming_the_field(
    api: tuple[httpx.AsyncClient, TemplateBuilds], start: dict[str, Any], field: str
) -> None:
    c, builds = api
    made = await _new(c)
    r = await c.post(
        f"/v2/templates/{made['templateID']}/builds/{made['buildID']}",
        json=start,
        headers=_as("alice"),
    )
    assert r.status_code == 400, r.text
    assert field in r.json()["message"]
    assert builds.publisher.published == []  # type: ignore[attr-defined]


async def test_another_users_template_does_not_exist_for_her(
    api: tuple[httpx.AsyncClient, TemplateBuilds],
) -> None:
    c, _ = api
    made = await _new(c)
    tid, bid = made["templateID"], made["buildID"]
    for method, path in (
        ("GET", f"/templates/{tid}"),
        ("GET", f"/templates/{tid}/files/{'a' * 64}"),
        ("GET", f"/templates/{tid}/builds/{bid}/status"),
        ("GET", "/templates/aliases/app"),
        ("DELETE", f"/templates/{tid}"),
        ("PATCH", f"/templates/{tid}"),
    ):
        r = await c.request(
            method, path, headers=_as("bob"), json={} if method == "PATCH" else None
        )
        assert r.status_code == 404, (method, path, r.text)
    r = await c.post(
        f"/v2/templates/{tid}/builds/{bid}", json={"fromImage": "debian"}, headers=_as("bob")
    )
    assert r.status_code == 404
    assert (await c.get("/templates", headers=_as("bob"))).json() == []
    # Bob's own template of the same name is another template.
    assert (await _new(c, user="bob"))["templateID"] != tid


async def test_only_an_admin_publishes_and_then_everyone_sees_it(
    api: tuple[httpx.AsyncClient, TemplateBuilds],
) -> None:
    c, _ = api
    tid = (await _new(c, name="shared-app"))["templateID"]
    r = await c.patch(f"/templates/{tid}", json={"public": True}, headers=_as("alice"))
    assert r.status_code == 403
    assert (await c.get("/templates/aliases/shared-app", headers=_as("bob"))).status_code == 404
    r = await c.patch(f"/templates/{tid}", json={"public": True}, headers=_as("admin"))
    assert r.status_code == 200, r.text
    seen = await c.get("/templates/aliases/shared-app", headers=_as("bob"))
    assert seen.status_code == 200
    assert seen.json() == {"templateID": tid, "public": True}
    # published is not hers: she cannot delete it
    assert (await c.delete(f"/templates/{tid}", headers=_as("bob"))).status_code == 404


async def test_upload_urls_are_signed_scoped_and_bounded(
    api: tuple[httpx.AsyncClient, TemplateBuilds],
) -> None:
    c, builds = api
    tid = (await _new(c))["templateID"]
    files_hash = hashlib.sha256(b"ctx").hexdigest()
    link = (await c.get(f"/templates/{tid}/files/{files_hash}", headers=_as("alice"))).json()
    assert link["present"] is False
    url = link["url"]
    assert url.startswith("http://api/templates/uploads/")
    body = _archive({"a.txt": b"hello"})
    # no API key needed (a presigned URL), but the token must be intact
    token = url.rsplit("/", 1)[1]
    tampered = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    assert (await c.put(f"/templates/uploads/{tampered}", content=body)).status_code == 403
    other = UploadSigner(b"k" * 32).sign(Grant("alice", tid, files_hash, expires=1))
    assert (await c.put(f"/templates/uploads/{other}", content=body)).status_code == 403  # expired
    forged = UploadSigner(b"not the key").sign(Grant("alice", tid, files_hash, expires=2**40))
    assert (await c.put(f"/templates/uploads/{forged}", content=body)).status_code == 403
    huge = await c.put(url, content=b"x" * (builds.max_upload_bytes + 1))
    assert huge.status_code == 413
    assert (await c.put(url, content=body)).status_code == 200
    again = (await c.get(f"/templates/{tid}/files/{files_hash}", headers=_as("alice"))).json()
    assert again["present"] is True
    # Bob's template cannot see Alice's upload under the same hash (per-owner storage).
    bob_tid = (await _new(c, name="bobs", user="bob"))["templateID"]
    bobs = (await c.get(f"/templates/{bob_tid}/files/{files_hash}", headers=_as("bob"))).json()
    assert bobs["present"] is False


async def test_build_quota_and_the_command_sent(
    api: tuple[httpx.AsyncClient, TemplateBuilds],
) -> None:
    c, builds = api
    first = await _new(c, name="one")
    second = await _new(c, name="two")
    start = {"fromImage": "python:3", "steps": [{"type": "RUN", "args": ["true"]}]}
    r = await c.post(
        f"/v2/templates/{first['templateID']}/builds/{first['buildID']}",
        json=start,
        headers=_as("alice"),
    )
    assert r.status_code == 202
    again = await c.post(
        f"/v2/templates/{first['templateID']}/builds/{first['buildID']}",
        json=start,
        headers=_as("alice"),
    )
    assert again.status_code == 409
    r = await c.post(
        f"/v2/templates/{second['templateID']}/builds/{second['buildID']}",
        json=start,
        headers=_as("alice"),
    )
    assert r.status_code == 429  # one concurrent build per user here
    (sent,) = builds.publisher.published  # type: ignore[attr-defined]
    assert sent.subject == f"sandbox.cmd.template_build.{first['buildID']}"
    await _new(c, name="three")
    assert (
        await c.post("/v3/templates", json={"name": "four"}, headers=_as("alice"))
    ).status_code == 429


async def test_tags_without_a_name_or_a_tag_are_refused(
    api: tuple[httpx.AsyncClient, TemplateBuilds],
) -> None:
    c, builds = api
    made = await _new(c)
    bid = made["buildID"]
    await builds.store.update_template(
        made["templateID"], lambda t: t.model_copy(update={"tags": {"default": bid}})
    )
    for bad in (":invalid-tag", "app:", "other:v1", "--ro-bind", "a\x00b"):
        r = await c.post(
            "/templates/tags", json={"target": "app", "tags": [bad]}, headers=_as("alice")
        )
        assert r.status_code == 400, (bad, r.text)
    r = await c.post(
        "/templates/tags", json={"target": "app", "tags": ["prod"]}, headers=_as("alice")
    )
    assert r.status_code == 201
    assert r.json() == {"tags": ["prod"], "buildID": bid}
