"""Dashboard sessions: the cookie holds a random session id (server-side, revocable), HttpOnly,
SameSite=Strict, Secure over HTTPS or behind a trusted proxy that says so; sign-in, actions and
sign-out need CSRF tokens. Raw HTTP against the real stack, the proxy rule in-process, and a
headless Chromium sign-in."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.api.app import create_app
from services.api.deps import Wiring
from services.api.settings import ApiSettings
from shared.web.limits import HttpLimits
from tests.api.fakes import FakeKeys, FakeLifecycle
from tests.api.guarded import guarded_api
from tests.conftest import skip_or_fail
from tests.support.keys import key_store
from tests.support.stack import Stack

COOKIE = "torpor_dashboard"
KEY = "e2b_" + "2" * 40


def login_token(c: httpx.Client) -> str:
    r = c.get("/dashboard/api/csrf")
    assert r.status_code == 200
    assert "torpor_login_csrf=" in r.headers["set-cookie"]
    return str(r.json()["csrfToken"])


def sign_in(c: httpx.Client, key: str) -> tuple[httpx.Response, str]:
    r = c.post("/dashboard/login", json={"apiKey": key}, headers={"X-CSRF-Token": login_token(c)})
    assert r.status_code == 200, r.text
    return r, str(r.json()["csrfToken"])


def session_cookie(r: httpx.Response) -> str:
    found = [h for h in r.headers.get_list("set-cookie") if h.startswith(f"{COOKIE}=")]
    assert len(found) == 1, r.headers.get_list("set-cookie")
    return found[0]


def test_sign_in_needs_its_csrf_token(stack: Stack) -> None:
    key = stack.keys["alice"]
    with httpx.Client(base_url=stack.api_url, timeout=60) as c:
        # No token; a token but no cookie (another site's form); a cookie but a wrong token.
        assert c.post("/dashboard/login", json={"apiKey": key}).status_code == 403
        token = login_token(c)
        with httpx.Client(base_url=stack.api_url, timeout=60) as other:
            refused = other.post(
                "/dashboard/login", json={"apiKey": key}, headers={"X-CSRF-Token": token}
            )
            assert refused.status_code == 403
            assert refused.json()["code"] == 403
        for wrong in ("", "x", token + "x", "%00", "--ro-bind", token[:-1]):
            r = c.post("/dashboard/login", json={"apiKey": key}, headers={"X-CSRF-Token": wrong})
            assert r.status_code == 403, wrong
        assert COOKIE not in c.cookies


def test_cookie_is_a_revocable_session_id_with_strict_attributes(stack: Stack) -> None:
    key = stack.keys["alice"]
    with httpx.Client(base_url=stack.api_url, timeout=60) as c:
        r, csrf = sign_in(c, key)
        header = session_cookie(r).lower()
        assert "httponly" in header
        assert "samesite=strict" in header
        assert "path=/" in header
        assert "secure" not in header  # plain http, no trusted proxy
        session_id = c.cookies[COOKIE]
        assert len(session_id) >= 40
        assert key not in session_id
        assert key[4:] not in session_id
        assert c.get("/dashboard/api/me").json()["user"] == "alice"

        # Cookie-authenticated writes need the session's CSRF token; sign-out too.
        assert c.post("/dashboard/api/sandboxes/nosuch/kill").status_code == 403
        bad = c.post("/dashboard/api/sandboxes/nosuch/kill", headers={"X-CSRF-Token": "x" * 43})
        assert bad.status_code == 403
        ok = c.post("/dashboard/api/sandboxes/nosuch/kill", headers={"X-CSRF-Token": csrf})
        assert ok.status_code == 404  # past the CSRF check: there is no such sandbox
        assert c.post("/dashboard/logout").status_code == 403
        assert c.get("/dashboard/api/me").status_code == 200  # still signed in
        assert c.post("/dashboard/logout", headers={"X-CSRF-Token": csrf}).status_code == 204

    # The server forgot the session: replaying the old cookie is refused.
    replay = httpx.get(f"{stack.api_url}/dashboard/api/me", cookies={COOKIE: session_id})
    assert replay.status_code == 401
    forged = httpx.get(
        f"{stack.api_url}/dashboard/api/me", cookies={COOKIE: secrets.token_urlsafe(32)}
    )
    assert forged.status_code == 401
    # The old design put the key itself in the cookie: that no longer signs anyone in.
    assert httpx.get(f"{stack.api_url}/dashboard/api/me", cookies={COOKIE: key}).status_code == 401


async def _issue_and_revoke(nats_url: str, user: str) -> tuple[str, Any]:
    held = contextlib.AsyncExitStack()
    keys = await held.enter_async_context(key_store(nats_url))
    key_id, secret = await keys.create(user)

    async def revoke() -> None:
        try:
            await keys.revoke(key_id)
        finally:
            await held.aclose()

    return secret, revoke


def test_revoking_the_key_ends_its_sessions(stack: Stack) -> None:
    loop = asyncio.new_event_loop()
    try:
        secret, revoke = loop.run_until_complete(_issue_and_revoke(stack.nats_url, "dave"))
        with httpx.Client(base_url=stack.api_url, timeout=60) as c:
            sign_in(c, secret)
            assert c.get("/dashboard/api/me").json()["user"] == "dave"
            loop.run_until_complete(revoke())
            assert c.get("/dashboard/api/me").status_code == 401
    finally:
        loop.close()


# ---- Secure behind a trusted proxy (in-process: the rule needs a configured proxy) -------------


@pytest.fixture
def behind_proxy() -> Iterator[str]:
    with guarded_api(ApiSettings(), HttpLimits(trusted_proxies="127.0.0.1/32"), KEY) as url:
        yield url


def test_cookie_is_secure_when_a_trusted_proxy_says_https(behind_proxy: str) -> None:
    https = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"}
    with httpx.Client(base_url=behind_proxy, headers=https, timeout=60) as c:
        issued = c.get("/dashboard/api/csrf")
        assert "; secure" in issued.headers["set-cookie"].lower()
        token = issued.json()["csrfToken"]
        # The client speaks HTTPS to the proxy, so its browser would send the Secure cookie back.
        with httpx.Client(
            base_url=behind_proxy, headers=https, cookies={"torpor_login_csrf": token}, timeout=60
        ) as tls:
            r = tls.post("/dashboard/login", json={"apiKey": KEY}, headers={"X-CSRF-Token": token})
        assert r.status_code == 200, r.text
        assert "; secure" in session_cookie(r).lower()
    # The same claim from an address that is not a trusted proxy is ignored.
    untrusted = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(base_url=behind_proxy, headers=https, transport=untrusted, timeout=60) as c:
        r, _ = sign_in(c, KEY)
        assert "secure" not in session_cookie(r).lower()


def test_cookie_secure_setting_forces_secure() -> None:
    keys = FakeKeys()
    keys.add(KEY, "alice")
    settings = ApiSettings(cookie_secure=True)
    app = create_app(
        settings, wiring=Wiring(settings=settings, lifecycle=FakeLifecycle(), keys=keys)
    )
    transport = httpx.ASGITransport(app=app)

    async def go() -> str:
        async with httpx.AsyncClient(transport=transport, base_url="http://api", timeout=60) as c:
            issued = await c.get("/dashboard/api/csrf")
            assert "; secure" in issued.headers["set-cookie"].lower()  # even over plain http
            token = issued.json()["csrfToken"]
            r = await c.post(
                "/dashboard/login",
                json={"apiKey": KEY},
                headers={"X-CSRF-Token": token, "Cookie": f"torpor_login_csrf={token}"},
            )
            assert r.status_code == 200, r.text
            return session_cookie(r)

    assert "; secure" in asyncio.run(go()).lower()


# ---- headless Chromium --------------------------------------------------------------------------

CHROMIUM = Path("/usr/bin/chromium")


def test_browser_session_cookie_is_out_of_reach_of_scripts(stack: Stack) -> None:
    if not CHROMIUM.exists():
        skip_or_fail("chromium is not installed: apt-get install -y chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        skip_or_fail("the playwright package is not installed")
    from tests.dashboard.test_browser import CHROMIUM_ARGS

    key = stack.keys["bob"]
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            context = browser.new_context()
            page = context.new_page()
            page.set_default_timeout(60_000)
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{stack.api_url}/dashboard")
            page.wait_for_selector("#login-form", state="visible")
            page.fill("#api-key", key)
            page.click("#login-form button[type=submit]")
            page.wait_for_selector("#user:has-text('bob')")
            cookies = {c["name"]: c for c in context.cookies()}
            session = cookies[COOKIE]
            assert session["httpOnly"] is True
            assert session["sameSite"] == "Strict"
            assert session["secure"] is False  # plain http on loopback
            assert session["value"] != key
            assert key[4:] not in session["value"]
            assert "torpor_login_csrf" not in cookies  # spent at sign-in
            assert COOKIE not in page.evaluate("document.cookie")
            assert key not in page.content()
            # Signed-in pages call the API with the session's CSRF token (the list loads).
            me = page.evaluate("fetch('/dashboard/api/me').then(r => r.json())")
            assert me["user"] == "bob"
            assert me["csrfToken"]
            # A script without the token cannot act, even with the cookie.
            status = page.evaluate(
                "fetch('/dashboard/logout', {method: 'POST'}).then(r => r.status)"
            )
            assert status == 403
            page.click("#logout")
            page.wait_for_selector("#login-form", state="visible")
            after = page.evaluate("fetch('/dashboard/api/me').then(r => r.status)")
            assert after == 401
            assert not errors, errors
        finally:
            browser.close()
