"""The dashboard in headless Chromium (Debian's ``chromium``, driven by Playwright's Python
package; ``playwright install`` is never needed) against a real ``torpor up``: sign in, see a
sandbox appear live, pause it and read its snapshot, resume it, watch sandboxes expire (alice has
PAUSE_RESUME: autoPause pauses, the other is killed), then the admin's view. Screenshots are
saved under ``test-artifacts/``."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import skip_or_fail
from tests.support.env import REPO
from tests.support.stack import Stack
from tests.support.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        skip_or_fail("chromium is not installed: apt-get install -y chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        skip_or_fail("the playwright package is not installed (pip install playwright)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@contextlib.contextmanager
def _page(browser: Any, up: Stack) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{up.api_url}/dashboard")
    try:
        yield page
    finally:
        context.close()
    assert not errors, f"JavaScript errors: {errors}"


def _sign_in(page: Any, key: str) -> None:
    page.wait_for_selector("#login-form", state="visible")
    page.fill("#api-key", key)
    page.click("#login-form button[type=submit]")


def _row(page: Any, name: str) -> str:
    return f"#sandboxes tbody tr[data-name='{name}']"


def _wait_state(page: Any, name: str, state: str, timeout: float = 60_000) -> None:
    page.wait_for_selector(f"{_row(page, name)}[data-state='{state}']", timeout=timeout)


def _api(up: Stack, user: str, method: str, path: str, **kwargs: Any) -> Any:
    with up.client(user) as c:
        r = c.request(method, path, **kwargs)
    assert r.status_code < 300, r.text
    return r.json() if r.content else None


def test_sign_in_pause_resume_and_expiry_in_chromium(
    up: Stack, browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from e2b import Sandbox

    ARTIFACTS.mkdir(exist_ok=True)
    tag = uuid.uuid4().hex[:6]
    web, auto, doomed = f"web-{tag}", f"nap-{tag}", f"die-{tag}"
    for key, value in up.sdk_env("alice").items():
        monkeypatch.setenv(key, value)

    with _page(browser, up) as page:
        # A wrong key is refused with a readable message and the form stays.
        _sign_in(page, "torpor_not-a-key")
        page.wait_for_selector("#login-error:has-text('not valid')")
        assert page.input_value("#api-key") == ""  # the secret does not linger in the DOM

        _sign_in(page, up.keys["alice"])
        page.wait_for_selector("#app", state="visible")
        page.wait_for_selector("#live.on")
        assert "alice" in page.inner_text("#user")
        assert "PAUSE_RESUME: on" in page.inner_text("#flag")

        # Created through the API: the row appears without a reload (server-sent events).
        created = _api(up, "alice", "POST", "/api/v1/sandbox", json={"name": web, "timeout": 600})
        _wait_state(page, web, "running")
        # Native names are per user; the SDK addresses the sandbox by the id behind the name.
        sbx = Sandbox.connect(created["sandboxId"])
        sleeper = sbx.commands.run("sleep 1000", background=True, cwd="/tmp")

        page.click(f"{_row(page, web)} td.mono")
        page.wait_for_selector("#detail", state="visible")
        page.click(f"{_row(page, web)} button[data-action=pause]")
        _wait_state(page, web, "paused")
        page.wait_for_selector("#snapshot tbody tr:has-text('sleep 1000')")
        snap_row = page.inner_text("#snapshot tbody tr:has-text('sleep 1000')")
        assert "/tmp" in snap_row
        assert str(sleeper.pid) in snap_row
        assert "captured" in page.inner_text("#snapshot-time")
        page.wait_for_selector("#events tbody tr[data-fact=paused]")
        page.screenshot(path=str(ARTIFACTS / "dashboard-snapshot.png"), full_page=True)

        page.click(f"{_row(page, web)} button[data-action=resume]")
        _wait_state(page, web, "running")
        page.wait_for_selector("#events tbody tr[data-fact=resumed]")
        assert page.inner_text(f"{_row(page, web)} td.deadline").startswith("in ")

        # Expiry: alice has PAUSE_RESUME, so autoPause pauses; without autoPause it is killed.
        _api(
            up,
            "alice",
            "POST",
            "/api/v1/sandbox",
            json={"name": auto, "timeout": 2, "autoPause": True},
        )
        _api(up, "alice", "POST", "/api/v1/sandbox", json={"name": doomed, "timeout": 2})
        _wait_state(page, doomed, "running")
        _wait_state(page, auto, "paused", timeout=90_000)
        page.wait_for_selector(_row(page, doomed), state="detached", timeout=90_000)

        page.click(f"{_row(page, auto)} td.mono")
        page.wait_for_selector("#events tbody tr[data-fact=expired]")
        expired = page.inner_text("#events tbody tr[data-fact=expired]")
        assert "decision=pause" in expired
        page.screenshot(path=str(ARTIFACTS / "dashboard-user.png"), full_page=True)

        page.click("#logout")
        page.wait_for_selector("#login-form", state="visible")

    with _page(browser, up) as admin:
        _sign_in(admin, up.keys["root"])
        admin.wait_for_selector(_row(admin, web))
        assert "alice" in admin.inner_text(f"{_row(admin, web)} td.admin-only")
        admin.wait_for_selector("#users tbody tr[data-user=alice]")
        assert "enabled" in admin.inner_text("#users tbody tr[data-user=alice]")
        assert "disabled" in admin.inner_text("#users tbody tr[data-user=bob]")
        admin.screenshot(path=str(ARTIFACTS / "dashboard-admin.png"), full_page=True)
        admin.select_option("#owner-filter", "bob")
        admin.wait_for_selector(_row(admin, web), state="detached")
        admin.select_option("#owner-filter", "alice")
        admin.wait_for_selector(_row(admin, web))

    for name in (web, auto):
        _api(up, "alice", "DELETE", f"/api/v1/sandbox/{name}")
    assert (ARTIFACTS / "dashboard-user.png").stat().st_size > 10_000


def test_signing_out_while_answers_are_on_the_way_shows_nothing_of_the_session(
    up: Stack, browser: Any
) -> None:
    """The sandbox list, usage and user list answered while signed in but arrive after the
    sign-out (CI saw the usage answer read ``state.me.user`` of a null session)."""
    held: list[Any] = []

    def hold(route: Any) -> None:  # a function: Playwright tags its handler (not a builtin)
        held.append(route)

    with _page(browser, up) as page:
        _sign_in(page, up.keys["root"])
        page.wait_for_selector("#users tbody tr[data-user=alice]")
        for path in ("/dashboard/api/sandboxes", "/dashboard/api/usage", "/dashboard/api/users"):
            page.route(f"**{path}", hold)
        page.evaluate("refresh(); loadUsage(); loadUsers(); null")
        # Route handlers run while Playwright waits (not while the test sleeps).
        until(lambda: page.wait_for_timeout(100) or len(held) >= 3, 30, "three loads held")
        answers = [(route, route.fetch()) for route in held]  # answered for the live session
        # three or more: the page's own periodic refresh may add a load meanwhile (CI: four)
        assert len(answers) >= 3 and {a.status for _, a in answers} == {200}, answers
        page.click("#logout")
        page.wait_for_selector("#login-form", state="visible")
        for route, answer in answers:
            route.fulfill(response=answer)
        page.wait_for_timeout(500)  # the answers' continuations run now (errors fail _page)
        assert page.is_hidden("#app")
        assert page.locator("#sandboxes tbody tr").count() == 0
        assert page.locator("#users tbody tr").count() == 0
