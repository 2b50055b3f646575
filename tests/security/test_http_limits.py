"""HTTP limits applied before any work, on the API and the proxy: bodies (401 before reading
when unauthenticated, 413 when too large), header size and count (431), heads and bodies that
trickle (408), connections and requests per client (503 / 429). Every refusal is JSON
``{"code", "message"}``, and another client's traffic keeps flowing meanwhile.

Against the real stack (default limits) where the default is what is tested; in-process (the
production app, protocol and limits under uvicorn, fakes behind) where a small limit is needed
to reach it quickly."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox

from services.api.settings import ApiSettings
from services.proxy.settings import ENVD_PORT, ProxySettings
from shared.web.limits import HttpLimits
from tests.api.guarded import guarded_api
from tests.proxy.guarded import guarded_proxy
from tests.security.rawhttp import (
    Answer,
    authority,
    closed_by_peer,
    connect,
    exchange,
    head,
    read_answer,
)
from tests.support.stack import Stack

OTHER_CLIENT = "127.0.0.2"  # loopback, a different client address than 127.0.0.1
POD_HOST = "127.0.9.77"  # this file's stand-in sandbox (unique: other test files use others)
KEY = "e2b_" + "1" * 40
HUGE = 100 * 1024 * 1024


def _answered(sock: socket.socket) -> Answer | None:
    """The server's answer once it has begun one (peeked within the socket's timeout), read
    whole; None while it has not."""
    try:
        data = sock.recv(65536, socket.MSG_PEEK)
    except TimeoutError:
        return None
    if not data:
        return None
    sock.settimeout(30)
    return read_answer(sock)


def assert_refusal(answer: Answer, status: int) -> None:
    assert answer.status == status, (answer.status, answer.body[:300])
    assert answer.headers["content-type"].startswith("application/json")
    body = answer.json()
    assert body["code"] == status
    assert isinstance(body["message"], str)
    assert body["message"]


def other_client_works(url: str, path: str = "/health", **headers: str) -> None:
    transport = httpx.HTTPTransport(local_address=OTHER_CLIENT)
    with httpx.Client(transport=transport, timeout=60) as client:
        assert client.get(f"{url}{path}", headers=headers).status_code == 200


# ---- the real stack, default limits ----------------------------------------------------------


def test_api_refuses_an_unauthenticated_body_without_reading_it(stack: Stack) -> None:
    host = authority(stack.api_url)
    for auth in ({}, {"X-API-KEY": "e2b_" + "0" * 40}):
        raw = head(
            "POST",
            "/v2/sandboxes",
            host,
            {**auth, "Content-Type": "application/json", "Content-Length": str(HUGE)},
        )
        # Not one byte of the announced 100 MiB is sent: the answer must not wait for it.
        assert_refusal(exchange(stack.api_url, raw), 401)


def test_api_refuses_a_too_large_body_from_a_known_key_with_413(stack: Stack) -> None:
    host = authority(stack.api_url)
    raw = head(
        "POST",
        "/v2/sandboxes",
        host,
        {
            "X-API-KEY": stack.keys["alice"],
            "Content-Type": "application/json",
            "Content-Length": str(HUGE),
        },
    )
    assert_refusal(exchange(stack.api_url, raw), 413)
    # Chunked, with no length announced: refused once 1 MiB (the default) is exceeded.
    with connect(stack.api_url) as sock:
        sock.sendall(
            head(
                "POST",
                "/api/v1/sandbox",
                host,
                {
                    "Authorization": f"Bearer {stack.keys['alice']}",
                    "Content-Type": "application/json",
                    "Transfer-Encoding": "chunked",
                },
            )
        )
        chunk = b"%x\r\n%b\r\n" % (65536, b" " * 65536)
        for _ in range(18):  # 1.1 MiB
            sock.sendall(chunk)
        assert_refusal(read_answer(sock), 413)


@pytest.mark.parametrize("service", ["api", "proxy"])
def test_huge_and_numerous_headers_are_431(stack: Stack, service: str) -> None:
    url = stack.api_url if service == "api" else stack.proxy_url
    host = authority(url)
    many = [(f"X-Filler-{i}", "x") for i in range(300)]
    assert_refusal(exchange(url, head("GET", "/health", host, many)), 431)
    for size in (64 * 1024, 400 * 1024):  # 400 KB once stalled the API for seconds
        with connect(url) as sock:
            sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\nX-Big: ".encode())
            try:
                sock.sendall(b"a" * size + b"\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused and closed while we were still sending: read what it said
            assert_refusal(read_answer(sock), 431)
    other_client_works(url)


@pytest.mark.parametrize("service", ["api", "proxy"])
def test_a_trickled_request_head_is_cut_off_while_others_flow(stack: Stack, service: str) -> None:
    url = stack.api_url if service == "api" else stack.proxy_url
    host = authority(url)
    answer: Answer | None = None
    with connect(url) as slow:
        slow.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\nX-Slow: ".encode())
        for i in range(120):  # one header byte per 0.25 s; the default deadline is 10 s
            try:
                slow.sendall(b"x")
            except (BrokenPipeError, ConnectionResetError):
                break
            if i == 4:
                other_client_works(url)  # the server is not blocked by the slow client
            slow.settimeout(0.25)
            if (answer := _answered(slow)) is not None:
                break
        assert answer is not None, "the trickling client was never cut off"
        assert_refusal(answer, 408)
        slow.settimeout(30)
        assert closed_by_peer(slow)
    other_client_works(url)


def test_proxy_refuses_bodies_before_reading_and_carries_uploads(stack: Stack) -> None:
    env = stack.sdk_env("alice")
    sbx = Sandbox.create(
        timeout=120,
        api_key=env["E2B_API_KEY"],
        api_url=env["E2B_API_URL"],
        sandbox_url=env["E2B_SANDBOX_URL"],
    )
    try:
        host = authority(stack.proxy_url)
        route = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(ENVD_PORT)}
        announce = {"Content-Type": "application/octet-stream", "Content-Length": str(2 * 1024**3)}
        raw = head("POST", "/files?path=/tmp/x", host, {**route, **announce})
        assert_refusal(exchange(stack.proxy_url, raw), 401)  # no access token: not read
        token = sbx._envd_access_token  # what the SDK itself sends
        assert token
        raw = head(
            "POST", "/files?path=/tmp/x", host, {**route, **announce, "X-Access-Token": token}
        )
        assert_refusal(exchange(stack.proxy_url, raw), 413)  # over the 1 GiB default
        # Larger than the API's limit, well within the proxy's: an upload goes through.
        payload = bytes(range(256)) * (8 * 1024)  # 2 MiB
        sbx.files.write("/tmp/upload.bin", payload)
        assert sbx.files.read("/tmp/upload.bin", format="bytes") == payload
    finally:
        sbx.kill()


# ---- in-process: the production app and protocol with small limits ---------------------------

SMALL = HttpLimits(
    header_timeout=2.0,
    body_idle_timeout=1.0,
    max_connections_per_client=4,
    max_requests_per_client=2,
)


@pytest.fixture
def small_api() -> Iterator[str]:
    with guarded_api(ApiSettings(body_timeout=3.0), SMALL, KEY) as url:
        yield url


def _partial_body(url: str) -> socket.socket:
    sock = connect(url)
    host = authority(url)
    sock.sendall(
        head(
            "POST",
            "/v2/sandboxes",
            host,
            {"X-API-KEY": KEY, "Content-Type": "application/json", "Content-Length": "100"},
        )
        + b'{"templateID":'
    )
    return sock


def test_slow_bodies_are_408(small_api: str) -> None:
    with _partial_body(small_api) as stalled:  # then nothing: idle deadline (1 s)
        assert_refusal(read_answer(stalled), 408)
    host = authority(small_api)
    with connect(small_api) as trickle:  # a byte every 0.5 s: idle is fine, total (3 s) is not
        trickle.sendall(
            head(
                "POST",
                "/v2/sandboxes",
                host,
                {"X-API-KEY": KEY, "Content-Type": "application/json", "Content-Length": "1000"},
            )
        )
        trickle.settimeout(0.5)
        answer = None
        for _ in range(40):
            try:
                trickle.sendall(b" ")
            except TimeoutError:
                continue
            if (answer := _answered(trickle)) is not None:
                break
        assert answer is not None
        assert_refusal(answer, 408)
        assert "within" in answer.json()["message"]


def test_requests_in_progress_per_client_are_bounded(small_api: str) -> None:
    host = authority(small_api)
    held = [_partial_body(small_api), _partial_body(small_api)]
    try:
        time.sleep(0.3)  # let the server take both in (no assertion on time)
        answer = exchange(small_api, head("GET", "/health", host, {}))
        if answer.status == 429:
            assert_refusal(answer, 429)
            assert answer.headers["retry-after"] == "1"
        else:  # the held requests already timed out on a very slow machine: nothing to show
            pytest.fail(f"expected 429 while two requests are held, got {answer.status}")
        other_client_works(small_api)
    finally:
        for sock in held:
            sock.close()
    for _ in range(50):  # the held requests end (408 or disconnect); then it works again
        if exchange(small_api, head("GET", "/health", host, {})).status == 200:
            break
        time.sleep(0.1)
    else:
        pytest.fail("client stayed refused after its requests ended")


def test_connections_per_client_are_bounded(small_api: str) -> None:
    idle = [connect(small_api) for _ in range(SMALL.max_connections_per_client)]
    try:
        with connect(small_api) as extra:
            assert_refusal(read_answer(extra), 503)
        other_client_works(small_api)
    finally:
        for sock in idle:
            sock.close()
    host = authority(small_api)
    for _ in range(50):
        if exchange(small_api, head("GET", "/health", host, {})).status == 200:
            break
        time.sleep(0.1)
    else:
        pytest.fail("client stayed refused after closing its connections")


@pytest.fixture
def small_proxy() -> Iterator[tuple[str, str, str]]:
    settings = ProxySettings(max_body_bytes=256 * 1024, body_timeout=5.0)
    with guarded_proxy(POD_HOST, SMALL, settings) as (url, record, port, _):
        yield url, record.sandbox_id, str(port)


def test_proxy_streams_a_body_until_it_is_too_large(small_proxy: tuple[str, str, str]) -> None:
    url, sandbox_id, port = small_proxy
    route = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": port}
    with httpx.Client(timeout=60) as client:
        fits = client.post(f"{url}/digest", headers=route, content=b"x" * 200_000)
        assert fits.status_code == 200, fits.text
        assert fits.json()["size"] == 200_000

        def chunks() -> Iterator[bytes]:
            for _ in range(10):
                yield b"y" * 65536

        over = client.post(f"{url}/digest", headers=route, content=chunks())
    assert over.status_code == 413
    assert over.json()["code"] == 413


def test_a_malformed_request_is_a_json_400(small_api: str) -> None:
    answer = exchange(small_api, b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
    assert_refusal(answer, 400)
