"""A create's ``secure: false`` (``TORPOR_INSECURE_SANDBOXES``, services/api/insecure.py).

Default ``secure``: accepted and still secured, as E2B's API does today. ``honor``: no access
token, so the id alone reaches the daemon through the proxy; hostile: another user's API key
(404), a bad key (401), guessed ids (nothing), a derivable id (Idempotency-Key) and untokened
private traffic refused. ``refuse``: 400. A secure sandbox still needs its token."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.api.errors import ApiError
from services.api.insecure import wants_token
from services.api.settings import ApiSettings
from shared.models.network import NetworkPolicy
from tests.support.fixtures import started
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

ENVD = "49983"


@pytest.fixture(scope="module")
def honoring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root: Path = tmp_path_factory.mktemp("insecure")
    yield from started(Stack(root, env_of={"api": {"TORPOR_INSECURE_SANDBOXES": "honor"}}))


def _api(stack: Stack, user: str = "alice") -> httpx.Client:
    return httpx.Client(
        base_url=stack.api_url,
        headers={"X-API-KEY": stack.keys[user]},
        timeout=90,
        trust_env=False,
    )


def _daemon(stack: Stack, sandbox_id: str, **headers: str) -> httpx.Response:
    return httpx.get(
        f"{stack.proxy_url}/envs",
        headers={"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": ENVD, **headers},
        timeout=30,
        trust_env=False,
    )


def _create(api: httpx.Client, **body: object) -> httpx.Response:
    return api.post("/v2/sandboxes", json={"templateID": "base", "timeout": 120, **body})


def test_by_default_secure_false_still_gets_a_token(stack: Stack) -> None:
    with _api(stack) as api:
        made = _create(api, secure=False)
        assert made.status_code == 201, made.text
        sandbox = made.json()
        try:
            assert sandbox["envdAccessToken"]
            assert _daemon(stack, sandbox["sandboxID"]).status_code == 401
            token = {"X-Access-Token": sandbox["envdAccessToken"]}
            assert _daemon(stack, sandbox["sandboxID"], **token).status_code == 200
        finally:
            api.delete(f"/sandboxes/{sandbox['sandboxID']}")


def test_honored_secure_false_and_who_reaches_it(honoring: Stack) -> None:
    with _api(honoring) as api:
        made = _create(api, secure=False)
        assert made.status_code == 201, made.text
        sandbox = made.json()
        sid = sandbox["sandboxID"]
        try:
            assert sandbox.get("envdAccessToken") is None
            assert re.fullmatch(r"i[a-z0-9]{19}", sid)  # 19 random base-36 characters
            assert _daemon(honoring, sid).status_code == 200  # the id alone, as on E2B
            other = _daemon(honoring, sid, **{"X-API-KEY": honoring.keys["bob"]})
            assert other.status_code == 404
            bad = _daemon(honoring, sid, **{"X-API-KEY": "e2b_" + "0" * 40})
            assert bad.status_code == 401
            for guess in ("i" + "0" * 19, sid[:-1] + ("a" if sid[-1] != "a" else "b"), sid.upper()):
                assert _daemon(honoring, guess).status_code in (400, 404, 502)
            with _api(honoring, "bob") as bob:
                assert bob.get(f"/sandboxes/{sid}").status_code == 404
            # A sandbox created without secure=false on the same torpor is still secured.
            secured = _create(api).json()
            try:
                assert secured["envdAccessToken"]
                assert _daemon(honoring, secured["sandboxID"]).status_code == 401
            finally:
                api.delete(f"/sandboxes/{secured['sandboxID']}")
        finally:
            api.delete(f"/sandboxes/{sid}")
        keyed = api.post(
            "/v2/sandboxes",
            json={"templateID": "base", "secure": False},
            headers={"Idempotency-Key": "guessable"},
        )
        assert keyed.status_code == 400 and "Idempotency-Key" in keyed.text
        private = _create(api, secure=False, network={"allowPublicTraffic": False})
        assert private.status_code == 400 and "allowPublicTraffic" in private.text


@pytest.mark.unit
def test_the_three_settings() -> None:
    policy = NetworkPolicy()
    assert wants_token(ApiSettings(), False, None, policy) is True
    assert wants_token(ApiSettings(insecure_sandboxes="honor"), False, None, policy) is False
    assert wants_token(ApiSettings(insecure_sandboxes="honor"), None, None, policy) is True
    assert wants_token(ApiSettings(insecure_sandboxes="refuse"), True, None, policy) is True
    with pytest.raises(ApiError) as refused:
        wants_token(ApiSettings(insecure_sandboxes="refuse"), False, None, policy)
    assert refused.value.status == 400
    assert "TORPOR_INSECURE_SANDBOXES" in refused.value.message
