"""The SDK's signed file URLs (``download_url``/``upload_url`` of a secure sandbox) through the
real proxy, routed by the ``{port}-{id}.{domain}`` host name as a deployment's DNS gives it,
with envd's answers E2B's suite expects (``test_secured.py``: an expired URL is a 401
``{"code": 401, "message": "signature is already expired"}``) and hostile URLs: tampered,
replayed for another path, user or operation, another tenant's sandbox's URL, garbled
expirations. None of them reads or writes a byte."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
import pytest
from e2b import Sandbox

from tests.support.stack import Stack

pytestmark = pytest.mark.slow

SECRET = "alice's signed secret"


@pytest.fixture(scope="module")
def alice(stack: Stack) -> Iterator[Sandbox]:
    opts = stack.sdk_opts("alice")
    s = Sandbox.create(template="base", timeout=300, secure=True, **opts)
    s.files.write("secret.txt", SECRET)
    yield s
    Sandbox.kill(s.sandbox_id, **opts)


@pytest.fixture(scope="module")
def bobs(stack: Stack) -> Iterator[Sandbox]:
    bob = stack.sdk_opts("bob")
    s = Sandbox.create(template="base", timeout=300, secure=True, **bob)
    yield s
    Sandbox.kill(s.sandbox_id, **bob)


@pytest.fixture(scope="module")
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.proxy_url, timeout=30) as client:
        yield client


def _send(
    http: httpx.Client, sbx: Sandbox, url: str, *, method: str = "GET", **edits: str
) -> httpx.Response:
    """``url`` (as the SDK made it) with its query fields replaced by ``edits``, sent to the
    proxy for ``sbx``'s daemon by host name only, like a browser following the link."""
    parts = urlsplit(url)
    params = dict(parse_qsl(parts.query, keep_blank_values=True)) | edits
    files = {"file": ("x", b"overwritten")} if method == "POST" else None
    return http.request(
        method,
        f"{parts.path}?{urlencode(params)}",
        headers={"Host": f"49983-{sbx.sandbox_id}.torpor.test"},
        files=files,
    )


def _refused(r: httpx.Response, message: str = "invalid signature") -> None:
    assert r.status_code == 401, r.text
    assert r.json() == {"code": 401, "message": message}
    assert SECRET not in r.text


def test_a_signed_download_url_reads_the_file(http: httpx.Client, alice: Sandbox) -> None:
    for url in (
        alice.download_url("secret.txt", "user"),
        alice.download_url("secret.txt", "user", 120),
    ):
        assert "signature=v1_" in url
        r = _send(http, alice, url)
        assert r.status_code == 200, r.text
        assert r.text == SECRET


def test_a_signed_upload_url_writes_the_file(http: httpx.Client, alice: Sandbox) -> None:
    url = alice.upload_url("uploaded.txt", "user", 120)
    r = _send(http, alice, url, method="POST")
    assert r.status_code == 200, r.text
    assert alice.files.read("uploaded.txt") == "overwritten"


def test_an_expired_signed_url_is_refused_as_envd_does(http: httpx.Client, alice: Sandbox) -> None:
    url = alice.download_url("secret.txt", "user", use_signature_expiration=-120)
    _refused(_send(http, alice, url), "signature is already expired")


def test_unsigned_and_tampered_urls_are_refused(http: httpx.Client, alice: Sandbox) -> None:
    url = alice.download_url("secret.txt", "user", 120)
    signature = dict(parse_qsl(urlsplit(url).query))["signature"]
    expiration = dict(parse_qsl(urlsplit(url).query))["signature_expiration"]
    for edits in (
        {"signature": signature[:-2] + ("AA" if not signature.endswith("AA") else "BB")},
        {"signature": "v1_"},
        {"signature": "v1_" + "A" * 4000},
        {"path": "/home/user/secret.txt"},  # the same file by another spelling: another URL
        {"path": "secret.txt\0"},
        {"path": "--ro-bind"},
        {"username": "root"},
        {"signature_expiration": str(int(expiration) + 3600)},  # a longer life than signed
        {"signature_expiration": "١٢٣"},  # int() would take these digits
        {"signature_expiration": "+" + expiration},
        {"signature_expiration": "9" * 40},
        {"signature_expiration": expiration + "\0"},
    ):
        _refused(_send(http, alice, url, **edits))
    # Not the SDK's signature format: the proxy refuses it as a request without a token.
    r = _send(http, alice, url, signature=signature[3:])
    assert r.status_code == 401
    assert SECRET not in r.text
    # A read URL is no write URL, and no signature at all is no access.
    _refused(_send(http, alice, url, method="POST"))
    assert alice.files.read("secret.txt") == SECRET
    r = _send(http, alice, url.split("?")[0] + "?path=secret.txt&username=user")
    assert r.status_code == 401
    assert SECRET not in r.text


def test_another_sandboxs_signed_url_is_refused(
    http: httpx.Client, alice: Sandbox, bobs: Sandbox
) -> None:
    """Bob's valid URL for the same path, sent to Alice's sandbox (it is signed with his
    sandbox's token), reads nothing of hers."""
    url = bobs.download_url("secret.txt", "user", 120)
    _refused(_send(http, alice, url))
    assert _send(http, bobs, url).status_code == 404  # his own sandbox has no such file


def test_a_signed_url_never_wakes_a_paused_sandbox(stack: Stack, http: httpx.Client) -> None:
    """The proxy cannot check a signature (only the daemon holds the token), so a signed URL,
    valid or forged, is anonymous there: it must not resume an auto-resume sandbox."""
    opts = stack.sdk_opts("alice")
    s = Sandbox.create(
        template="base",
        timeout=300,
        secure=True,
        lifecycle={"on_timeout": "pause", "auto_resume": True},
        **opts,
    )
    try:
        url = s.download_url("secret.txt", "user", 120)
        s.pause()
        r = _send(http, s, url)
        assert r.status_code == 502, r.text
        assert "not found" in r.json()["message"]
        assert Sandbox.get_info(s.sandbox_id, **opts).state.value == "paused"
    finally:
        Sandbox.kill(s.sandbox_id, **opts)
