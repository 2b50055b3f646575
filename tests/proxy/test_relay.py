"""The proxy's relay (``services.proxy.relay``): its own request parsing, per-request
authorisation on one connection, the handover to the ASGI server, and its own deadlines, with
hostile clients over real sockets and the production server. Every case also asserts what the
sandbox saw: a refused or ambiguous request never reaches it, and one exchange never spills
into the next."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from services.proxy.app import ProxyApp, ProxyWiring
from services.proxy.settings import ProxySettings
from shared.domain.record import SandboxRecord
from shared.ports.lifecycle import CreateRequest
from shared.web.limits import HttpLimits
from tests.api.fakes import FakeLifecycle, FakeRecords
from tests.proxy.conftest import Rig
from tests.proxy.guarded import Guarded, guarded_proxy
from tests.proxy.upstream import UpstreamState, build_upstream
from tests.security.rawhttp import (
    authority,
    closed_by_peer,
    connect,
    head,
    read_answer,
    read_answers,
    serve_guarded,
)
from tests.support.serving import serve

from .test_proxy import make, to

RELAY_HOST = (
    "127.0.4.215"  # this file's own upstream address (.214: test_fastpath, .220 up: the rig)
)


def relayed(app: ProxyApp) -> float:
    return app.fast_exchanges._value.get()


def handovers(app: ProxyApp) -> float:
    return app.handovers._value.get()


def routed(rig: Rig, sbx: SandboxRecord, **extra: str) -> list[tuple[str, str]]:
    return [*to(sbx, rig.user_port).items(), *extra.items()]


def test_ordinary_requests_are_relayed_without_a_handover(rig: Rig) -> None:
    sbx = make(rig)
    before, handed = relayed(rig.app), handovers(rig.app)
    with httpx.Client(timeout=30) as client:
        for i in range(5):
            r = client.get(f"{rig.proxy}/echo?n={i}", headers=to(sbx, rig.user_port))
            assert r.json()["query"] == f"n={i}"
        body = b"\x00\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n" * 100
        r = client.post(f"{rig.proxy}/digest", content=body, headers=to(sbx, rig.user_port))
        assert r.json() == {"sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}
    assert relayed(rig.app) - before == 6
    assert handovers(rig.app) == handed


def test_each_pipelined_request_is_authorised_on_its_own(rig: Rig) -> None:
    """One connection, one token, two sandboxes: the second request carries the first
    sandbox's token for the other sandbox's daemon port and must not reach it."""
    mine, theirs = make(rig), make(rig, owner="bob")
    host = authority(rig.proxy)
    token = {"X-Access-Token": mine.envd_access_token or ""}
    ok = head("GET", "/echo?n=1", host, {**to(mine), **token})
    stolen = head("GET", "/echo?n=2", host, {**to(theirs, token=False), **token})
    again = head("GET", "/echo?n=3", host, {**to(mine), **token})
    before = rig.upstream.requests
    with connect(rig.proxy) as sock:
        sock.sendall(ok + stolen + again)
        first, second, third = read_answers(sock, 3)
    assert first.status == 200
    assert first.json()["query"] == "n=1"
    assert second.status == 401
    assert second.json()["code"] == 401
    assert third.status == 200
    assert third.json()["query"] == "n=3"
    assert rig.upstream.requests - before == 2  # n=1 and n=3 only


def test_a_token_switch_on_a_kept_alive_connection_is_checked_again(rig: Rig) -> None:
    sbx = make(rig)
    host = authority(rig.proxy)
    with connect(rig.proxy) as sock:
        sock.sendall(head("GET", "/echo", host, to(sbx)))
        assert read_answer(sock).status == 200
        wrong = {**to(sbx, token=False), "X-Access-Token": "not-the-token"}
        sock.sendall(head("GET", "/echo", host, wrong))
        answer = read_answer(sock)
    assert answer.status == 401


def test_a_body_in_pieces_and_a_pipelined_request_keep_their_bounds(rig: Rig) -> None:
    """The head, then the body in two pieces whose last one carries the next request: the
    sandbox sees exactly the declared body, then the next request on its own."""
    sbx = make(rig)
    host = authority(rig.proxy)
    body = b"0123456789" * 10
    first = head("POST", "/digest", host, routed(rig, sbx, **{"Content-Length": "100"}))
    second = head("GET", "/echo?n=2", host, routed(rig, sbx))
    before = relayed(rig.app)
    with connect(rig.proxy) as sock:
        sock.sendall(first)
        time.sleep(0.05)
        sock.sendall(body[:30])
        time.sleep(0.05)
        sock.sendall(body[30:] + second)
        one, two = read_answers(sock, 2)
    assert one.json() == {"sha256": hashlib.sha256(body).hexdigest(), "size": 100}
    assert two.json()["query"] == "n=2"
    assert relayed(rig.app) - before == 2


def test_bytes_beyond_the_declared_length_are_a_new_request_not_body(rig: Rig) -> None:
    """Content-Length 3 followed by more bytes: the sandbox gets 3 bytes of body; the rest is
    parsed as the next request, which is garbage, so the client gets 400 and the sandbox
    nothing more."""
    sbx = make(rig)
    host = authority(rig.proxy)
    raw = head("POST", "/digest", host, routed(rig, sbx, **{"Content-Length": "3"}))
    extra = b"abcdef\r\nX-Smuggled: 1\r\n\r\n"
    before = rig.upstream.requests
    with connect(rig.proxy) as sock:
        sock.sendall(raw + extra)
        one, two = read_answers(sock, 2)
        assert closed_by_peer(sock)
    assert one.json() == {"sha256": hashlib.sha256(b"abc").hexdigest(), "size": 3}
    assert two.status == 400
    assert rig.upstream.requests == before  # /digest does not count; nothing else arrived


@pytest.mark.parametrize(
    "bad",
    [
        b"GET /echo\x00 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Evil: a\x00b\r\n\r\n",
        b"GET /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3"
        b"\r\n\r\n0\r\n\r\n",
        b"GET /echo HTTP/1.1\r\nHost: x\r\n X-Folded: yes\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # TLS on the plain port
    ],
    ids=["nul-url", "nul-header", "two-lengths", "te-and-cl", "folded", "tls"],
)
def test_a_hostile_second_request_after_a_relayed_one_reaches_nobody(rig: Rig, bad: bytes) -> None:
    sbx = make(rig)
    host = authority(rig.proxy)
    routing = "".join(f"{k}: {v}\r\n" for k, v in routed(rig, sbx)).encode()
    hostile = bad.replace(b"Host: x\r\n", b"Host: x\r\n" + routing, 1)
    before = rig.upstream.requests
    with connect(rig.proxy) as sock:
        sock.sendall(head("GET", "/echo?n=1", host, routed(rig, sbx)) + hostile)
        got = read_answers(sock, 2)
        assert got[0].json()["query"] == "n=1"
        assert [a.status for a in got[1:]] in ([], [400]), got[1:]  # closed, or 400 and closed
        assert closed_by_peer(sock)
    assert rig.upstream.requests - before == 1


def test_a_huge_second_head_is_431_and_many_pipelined_requests_stay_in_order(rig: Rig) -> None:
    sbx = make(rig)
    host = authority(rig.proxy)
    many = b"".join(head("GET", f"/echo?n={i}", host, routed(rig, sbx)) for i in range(50))
    huge = head("GET", "/echo", host, routed(rig, sbx, **{"X-Big": "a" * 20000}))
    before = rig.upstream.requests
    with connect(rig.proxy) as sock:
        sock.sendall(many + huge)
        got = read_answers(sock, 51)
    assert [a.json()["query"] for a in got[:50]] == [f"n={i}" for i in range(50)]
    assert got[50].status == 431
    assert rig.upstream.requests - before == 50


def test_a_head_in_pieces_is_handed_over_and_answered_alike(rig: Rig) -> None:
    sbx = make(rig)
    raw = head("GET", "/echo?n=1", authority(rig.proxy), routed(rig, sbx))
    handed = handovers(rig.app)
    with connect(rig.proxy) as sock:
        sock.sendall(raw[:20])
        time.sleep(0.05)
        sock.sendall(raw[20:])
        answer = read_answer(sock)
        sock.sendall(raw)  # the connection stays with the ASGI server, and works
        again = read_answer(sock)
    assert answer.json()["query"] == "n=1"
    assert again.json()["query"] == "n=1"
    assert handovers(rig.app) - handed == 1


def test_a_client_gone_mid_answer_frees_its_slot_and_count(rig: Rig) -> None:
    sbx = make(rig)
    with connect(rig.proxy) as sock:
        sock.sendall(head("GET", "/endless", authority(rig.proxy), routed(rig, sbx)))
        assert b"tick" in sock.recv(65536)
    assert rig.upstream.stream_closed.wait(5), "the proxy kept reading a stream nobody wants"
    deadline = time.monotonic() + 5
    while rig.app.in_flight._counts and time.monotonic() < deadline:
        time.sleep(0.02)
    assert rig.app.in_flight._counts == {}
    slots = rig.app.slot(rig.pod_host, rig.user_port)
    assert slots.try_take()  # all free again
    slots.give()


# ---- the relay's own deadlines (small limits) -----------------------------------------------

SMALL = HttpLimits(header_timeout=0.5, body_idle_timeout=0.5)


@pytest.fixture(scope="module")
def small() -> Iterator[Guarded]:
    with guarded_proxy(RELAY_HOST, SMALL, timeout_keep_alive=1) as proxy:
        yield proxy


def test_a_silent_connection_is_408(small: Guarded) -> None:
    url = small[0]
    with connect(url) as sock:
        answer = read_answer(sock)  # nothing sent at all
        assert answer.status == 408
        assert answer.json()["code"] == 408
        assert closed_by_peer(sock)


def test_a_stalled_body_is_408_and_frees_its_count(
    small: Guarded,
) -> None:
    url, sbx, port, state = small
    before = state.requests
    raw = head("POST", "/echo", authority(url), [*to(sbx, port).items(), ("Content-Length", "9")])
    with connect(url) as sock:
        sock.sendall(raw + b"1234")
        answer = read_answer(sock)
    assert answer.status == 408
    assert state.requests == before


def test_an_idle_kept_alive_connection_is_closed_quietly(
    small: Guarded,
) -> None:
    url, sbx, port, _ = small
    with connect(url) as sock:
        sock.sendall(head("GET", "/echo", authority(url), to(sbx, port)))
        assert read_answer(sock).status == 200
        sock.settimeout(10)
        started = time.monotonic()
        assert sock.recv(65536) == b""  # closed after the keep-alive time, no bytes
        assert time.monotonic() - started < 8


FEW = HttpLimits(max_connections_per_client=8)


def test_a_connection_over_the_per_client_limit_is_503_from_the_relay_too() -> None:
    state = UpstreamState()
    lifecycle = FakeLifecycle(host=RELAY_HOST)
    app = ProxyApp(
        ProxySettings(),
        wiring=ProxyWiring(records=FakeRecords(lifecycle), lifecycle=lifecycle, keys=None),
        limits=FEW,
    )
    socks: list[socket.socket] = []
    with (
        serve(build_upstream(state), host=RELAY_HOST) as upstream,
        serve_guarded(app, FEW) as url,
    ):
        sbx = asyncio.run(lifecycle.create(CreateRequest(owner="alice")))
        port = int(upstream.rsplit(":", 1)[1])
        try:
            socks = [connect(url) for _ in range(FEW.max_connections_per_client + 1)]
            refused = read_answer(socks[-1])
            assert refused.status == 503
            assert closed_by_peer(socks[-1])
            socks[0].sendall(head("GET", "/echo", authority(url), to(sbx, port)))
            assert read_answer(socks[0]).status == 200  # the others still work
        finally:
            for sock in socks:
                sock.close()
