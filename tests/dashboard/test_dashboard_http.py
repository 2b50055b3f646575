"""The dashboard's HTTP surface against a real ``torpor up``: sign-in cookie, scoping by user,
anti-CSRF header, decoded snapshots, event history (dashboard and native), server-sent events
filtered per user, and the admin's user list with PAUSE_RESUME status."""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from tests.support.stack import Stack

pytestmark = pytest.mark.slow


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _create(up: Stack, user: str, name: str, **extra: Any) -> dict[str, Any]:
    with up.client(user) as c:
        r = c.post("/api/v1/sandbox", json={"name": name, "timeout": 600, **extra})
    assert r.status_code == 201, r.text
    return r.json()


def _kill(up: Stack, user: str, name: str) -> None:
    with up.client(user) as c:
        c.delete(f"/api/v1/sandbox/{name}")


class _Session(httpx.Client):
    """A client signed in to the dashboard (the cookie jar holds the session id)."""

    csrf: str = ""

    def __enter__(self) -> _Session:
        return self

    @property
    def h(self) -> dict[str, str]:
        """The session's CSRF header, which every cookie-authenticated write needs."""
        return {"X-CSRF-Token": self.csrf}


def _login_csrf(c: httpx.Client) -> dict[str, str]:
    return {"X-CSRF-Token": c.get("/dashboard/api/csrf").json()["csrfToken"]}


def _login(up: Stack, user: str) -> _Session:
    c = _Session(base_url=up.api_url, timeout=90)
    r = c.post("/dashboard/login", json={"apiKey": up.keys[user]}, headers=_login_csrf(c))
    assert r.status_code == 200, r.text
    c.csrf = r.json()["csrfToken"]
    return c


def test_page_is_served_with_a_strict_content_security_policy(up: Stack) -> None:
    page = httpx.get(f"{up.api_url}/dashboard")
    assert page.status_code == 200
    assert "<title>torpor" in page.text
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp
    assert "unsafe-inline" not in csp
    js = httpx.get(f"{up.api_url}/dashboard/static/app.js")
    assert js.status_code == 200
    assert js.headers["content-type"].startswith("text/javascript")
    assert "innerHTML" not in js.text  # data goes into the page as text only
    assert httpx.get(f"{up.api_url}/dashboard/static/../app.py").status_code == 404


def test_login_sets_an_httponly_cookie_and_never_logs_the_key(up: Stack) -> None:
    with httpx.Client(base_url=up.api_url) as c:
        bad = c.post("/dashboard/login", json={"apiKey": "e2b_wrong"}, headers=_login_csrf(c))
        assert bad.status_code == 401
    assert httpx.get(f"{up.api_url}/dashboard/api/me").status_code == 401

    with httpx.Client(base_url=up.api_url) as c:
        r = c.post("/dashboard/login", json={"apiKey": up.keys["alice"]}, headers=_login_csrf(c))
        assert r.status_code == 200
        body = r.json()
        csrf = body.pop("csrfToken")
        assert body == {"user": "alice", "admin": False, "pauseResume": True, "live": True}
        cookie = r.headers.get_list("set-cookie")[0].lower()
        assert cookie.startswith("torpor_dashboard=")
        assert "httponly" in cookie
        assert "samesite=strict" in cookie
        assert up.keys["alice"].lower() not in cookie  # a session id, not the key
        assert c.get("/dashboard/api/me").json()["user"] == "alice"
        assert c.post("/dashboard/logout", headers={"X-CSRF-Token": csrf}).status_code == 204
        c.cookies.clear()  # the browser drops it on the expired Set-Cookie
        assert c.get("/dashboard/api/me").status_code == 401

    with httpx.Client(base_url=up.api_url) as c:
        form = c.post("/dashboard/login", data={"apiKey": up.keys["bob"]}, headers=_login_csrf(c))
        assert form.status_code == 200
        assert form.json()["user"] == "bob"

    logs = up.all_logs()
    for secret in up.keys.values():
        assert secret not in logs


def test_each_user_sees_only_their_own_and_admins_see_everyone(up: Stack) -> None:
    mine = _name("scope")
    _create(up, "alice", mine)
    try:
        with _login(up, "alice") as alice, _login(up, "bob") as bob, _login(up, "root") as root:
            names = [s["name"] for s in alice.get("/dashboard/api/sandboxes").json()]
            assert mine in names
            # A non-admin's owner filter cannot widen their scope.
            assert mine in [
                s["name"] for s in alice.get("/dashboard/api/sandboxes?owner=bob").json()
            ]
            assert mine not in [s["name"] for s in bob.get("/dashboard/api/sandboxes").json()]
            assert bob.get(f"/dashboard/api/sandboxes/{mine}").status_code == 404
            assert bob.get(f"/dashboard/api/sandboxes/{mine}/events").status_code == 404
            forged = bob.post(f"/dashboard/api/sandboxes/{mine}/kill", headers=bob.h)
            assert forged.status_code == 404

            every = {s["name"]: s for s in root.get("/dashboard/api/sandboxes").json()}
            assert every[mine]["owner"] == "alice"
            only_bob = root.get("/dashboard/api/sandboxes?owner=bob").json()
            assert all(s["owner"] == "bob" for s in only_bob)
            assert mine not in [s["name"] for s in only_bob]
    finally:
        _kill(up, "alice", mine)


def test_pause_shows_the_decoded_snapshot_and_writes_need_the_dashboard_header(up: Stack) -> None:
    name = _name("snap")
    created = _create(up, "alice", name)
    assert created["state"] == "running"
    try:
        with _login(up, "alice") as alice:
            # The cookie alone is not enough to change anything (cross-site forms send it).
            refused = alice.post(f"/dashboard/api/sandboxes/{name}/pause")
            assert refused.status_code == 403
            assert alice.get(f"/dashboard/api/sandboxes/{name}").json()["state"] == "running"

            h = alice.h
            paused = alice.post(f"/dashboard/api/sandboxes/{name}/pause", headers=h)
            assert paused.status_code == 200, paused.text
            body = paused.json()
            assert body["state"] == "paused"
            snap = body["snapshot"]
            assert snap["error"] is None
            assert snap["capturedTime"].endswith("Z")
            assert isinstance(snap["processes"], list)

            again = alice.post(f"/dashboard/api/sandboxes/{name}/pause", headers=h)
            assert again.status_code == 409

            resumed = alice.post(f"/dashboard/api/sandboxes/{name}/resume", headers=h)
            assert resumed.status_code == 200, resumed.text
            assert resumed.json()["state"] == "running"
            assert resumed.json()["deadline"] is not None

            # The history is read from the event stream, which may trail the answer a moment.
            deadline = time.monotonic() + 30
            while True:
                events = alice.get(f"/dashboard/api/sandboxes/{name}/events").json()
                facts = [e["fact"] for e in events]
                if "resumed" in facts or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert facts[0] == "created"
            assert facts.index("paused") < facts.index("resumed")
    finally:
        _kill(up, "alice", name)


def test_native_events_endpoint_for_the_cli(up: Stack) -> None:
    name = _name("logs")
    sandbox_id = _create(up, "bob", name)["sandboxId"]
    _kill(up, "bob", name)
    with up.client("bob") as bob:
        r = bob.get(f"/api/v1/sandbox/{name}/events")
        assert r.status_code == 200, r.text
        events = r.json()["events"]
        facts = [e["fact"] for e in events]
        # Still readable after the kill, while the tombstone lasts.
        assert facts[0] == "created"
        assert facts[-1] == "killed"
        seqs = [e["seq"] for e in events]
        assert seqs == sorted(seqs)
        assert all(e["sandboxId"] == sandbox_id for e in events)
        assert bob.get(f"/api/v1/sandbox/{name}/events?limit=1").json()["events"][0]["fact"] == (
            "killed"
        )
        assert bob.get("/api/v1/sandbox/nope-nope/events").status_code == 404
    with up.client("alice") as alice:
        assert alice.get(f"/api/v1/sandbox/{name}/events").status_code == 404
    with up.client("alice") as alice:
        assert alice.get(f"/api/v1/sandbox/{sandbox_id}/events").status_code == 404
    with up.client("root") as root:  # names are per user: an admin reads others' by id
        assert root.get(f"/api/v1/sandbox/{sandbox_id}/events").status_code == 200
    wrong = httpx.get(
        f"{up.api_url}/api/v1/sandbox/{name}/events", headers={"X-API-KEY": "torpor_nope"}
    )
    assert wrong.status_code == 401


@contextmanager
def _sse(client: httpx.Client, path: str = "/dashboard/api/stream") -> Iterator[queue.Queue]:
    """Server-sent events of one stream, parsed, on a queue (read by a thread)."""
    events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
    connected = threading.Event()
    stop = threading.Event()

    def read() -> None:
        try:
            _read()
        except httpx.HTTPError:
            if not stop.is_set():
                raise

    def _read() -> None:
        with client.stream("GET", path, timeout=httpx.Timeout(60, read=60)) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            kind = ""
            for line in r.iter_lines():
                if stop.is_set():
                    return
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    data = json.loads(line[6:])
                    if kind == "hello":
                        connected.set()
                    events.put((kind, data))

    t = threading.Thread(target=read, daemon=True)
    t.start()
    assert connected.wait(20), "no hello on the event stream"
    try:
        yield events
    finally:
        stop.set()
        client.close()
        t.join(5)


def _until(events: queue.Queue, predicate: Any, timeout: float = 30) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            kind, data = events.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if kind == "sandbox":
            seen.append(data)
            if predicate(data):
                return seen
    raise AssertionError(f"event not seen within {timeout}s; saw {seen}")


def test_live_events_reach_only_the_owner_and_admins(up: Stack) -> None:
    hers, his = _name("live-a"), _name("live-b")
    with (
        _sse(_login(up, "alice")) as alice_events,
        _sse(_login(up, "bob")) as bob_events,
        _sse(_login(up, "root")) as root_events,
    ):
        # Events carry the sandbox id (names are per user).
        her_id = _create(up, "alice", hers)["sandboxId"]
        his_id = _create(up, "bob", his)["sandboxId"]  # bob's own event: how far his stream got
        try:
            got = _until(
                alice_events, lambda e: e["sandboxId"] == her_id and e["fact"] == "created"
            )
            assert got[-1]["owner"] == "alice"
            seen_by_bob = _until(bob_events, lambda e: e["sandboxId"] == his_id)
            assert all(e["owner"] == "bob" for e in seen_by_bob)
            assert her_id not in {e["sandboxId"] for e in seen_by_bob}
            seen_by_root = _until(root_events, lambda e: e["sandboxId"] == his_id)
            assert her_id in {e["sandboxId"] for e in seen_by_root}
        finally:
            _kill(up, "alice", hers)
            _kill(up, "bob", his)
        killed = _until(alice_events, lambda e: e["sandboxId"] == her_id and e["fact"] == "killed")
        assert killed[-1]["data"]["type"] == "sandbox.evt.killed"


def test_admin_sees_users_with_their_pause_resume_status(up: Stack) -> None:
    with _login(up, "alice") as alice:
        assert alice.get("/dashboard/api/users").status_code == 403
    with _login(up, "root") as root:
        users = {u["name"]: u for u in root.get("/dashboard/api/users").json()}
        assert users["alice"]["pauseResume"] is True  # PAUSE_RESUME=alice
        assert users["bob"]["pauseResume"] is False
        assert users["root"]["admin"] is True
        assert root.get("/dashboard/api/me").json()["admin"] is True


def test_usage_panel_shows_the_signed_in_users_usage(up: Stack) -> None:
    """The usage panel's data on ``torpor up`` (the ledger runs there): the user's own sandboxes
    only; an admin may pick whose; a user's owner filter is ignored."""
    name = _name("usage")
    created = _create(up, "alice", name)
    try:
        with _login(up, "alice") as alice:

            def listed() -> dict[str, Any] | None:
                usage = alice.get("/dashboard/api/usage").json()
                ids = {s["sandboxId"] for s in usage["sandboxes"]}
                return usage if created["sandboxId"] in ids else None

            deadline = time.monotonic() + 60
            while (usage := listed()) is None and time.monotonic() < deadline:
                time.sleep(0.5)
            assert usage is not None, "the ledger never recorded the new sandbox"
            assert usage["user"] == "alice" and usage["totals"]["sandboxes"] >= 1
            assert usage["totals"]["runningSeconds"] >= 0
            theirs = alice.get("/dashboard/api/usage", params={"owner": "bob"}).json()
            assert theirs["user"] == "alice"  # a user cannot look at someone else's
        with _login(up, "root") as root:
            seen = root.get("/dashboard/api/usage", params={"owner": "alice"}).json()
            assert created["sandboxId"] in {s["sandboxId"] for s in seen["sandboxes"]}
        page = httpx.get(f"{up.api_url}/dashboard").text
        assert 'id="usage-panel"' in page
    finally:
        _kill(up, "alice", name)
