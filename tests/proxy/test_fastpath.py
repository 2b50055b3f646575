"""The proxy's fast path (``services.proxy.fastpath``) with hostile inputs, over real sockets and
the production server (protocol + limits): request smuggling attempts, NUL bytes, oversized and
trickled heads, pipelining, and hostile answers from the sandbox side (conflicting framing, NUL
bytes, an endless head, a body cut short). The fast path must answer exactly what the ASGI path
answers, never forward an ambiguous request, and never let one exchange spill into the next."""

from __future__ import annotations

import hashlib
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from services.proxy.app import ProxyApp
from shared.domain.record import SandboxRecord
from shared.web.limits import HttpLimits
from tests.proxy.conftest import Rig
from tests.proxy.guarded import Guarded, guarded_proxy
from tests.security.rawhttp import (
    Answer,
    authority,
    closed_by_peer,
    connect,
    exchange,
    head,
    read_answer,
    read_answers,
)

from .test_proxy import make, to

HOSTILE_HOST = "127.0.4.214"  # this file's raw upstream (the proxy rig uses .220 and up)


def fast_count(app: ProxyApp) -> float:
    return app.fast_exchanges._value.get()


def routed(rig: Rig, sbx: SandboxRecord, port: int | None = None) -> list[tuple[str, str]]:
    return list(to(sbx, port or rig.user_port).items())


def test_ordinary_requests_take_the_fast_path_and_keep_their_meaning(rig: Rig) -> None:
    sbx = make(rig)
    before = fast_count(rig.app)
    with httpx.Client(timeout=30) as client:
        r = client.get(f"{rig.proxy}/echo?a=1&b=%20", headers=to(sbx, rig.user_port))
        assert r.status_code == 200, r.text
        seen = r.json()
        assert seen["query"] == "a=1&b=%20"
        assert seen["headers"]["x-forwarded-for"] == "127.0.0.1"
        assert "x-access-token" in seen["headers"]  # the app's own header, on a user port
        assert "e2b-sandbox-id" not in seen["headers"]
        body = b"\x00binary\xff" * 1000
        r = client.post(f"{rig.proxy}/digest", content=body, headers=to(sbx, rig.user_port))
        assert r.json() == {"sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}
        r = client.head(f"{rig.proxy}/echo", headers=to(sbx, rig.user_port))
        assert r.status_code == 405 or r.status_code == 200
        assert r.content == b""
        r = client.get(f"{rig.proxy}/echo", headers=to(sbx, rig.user_port))  # after the HEAD
        assert r.status_code == 200
        # streamed (no Content-Length) answers are re-chunked to the client
        r = client.get(f"{rig.proxy}/big?size=300000", headers=to(sbx, rig.user_port))
        assert len(r.content) == 300000
    assert fast_count(rig.app) - before >= 5


def test_pipelined_requests_are_answered_in_order(rig: Rig) -> None:
    sbx = make(rig)
    host = authority(rig.proxy)
    one = head("GET", "/echo?n=1", host, routed(rig, sbx))
    two = head("GET", "/echo?n=2", host, routed(rig, sbx))
    with connect(rig.proxy) as sock:
        sock.sendall(one + two)
        first, second = read_answers(sock, 2)  # both may come in one read
    assert first.json()["query"] == "n=1"
    assert second.json()["query"] == "n=2"


def test_connection_close_is_honoured(rig: Rig) -> None:
    sbx = make(rig)
    raw = head("GET", "/echo", authority(rig.proxy), [*routed(rig, sbx), ("Connection", "close")])
    with connect(rig.proxy) as sock:
        sock.sendall(raw)
        answer = read_answer(sock)
        assert answer.status == 200
        assert answer.headers.get("connection") == "close"
        assert closed_by_peer(sock)


SMUGGLING = [
    # CL.TE: the front end reads 4 bytes, a back end honouring TE would see a second request
    [("Content-Length", "4"), ("Transfer-Encoding", "chunked")],
    [("Transfer-Encoding", "chunked"), ("Content-Length", "4")],
    # two different lengths
    [("Content-Length", "4"), ("Content-Length", "40")],
    [("Content-Length", "4, 40")],
    [("Content-Length", "-4")],
    [("Content-Length", "+4")],
    [("Content-Length", "0x4")],
]


@pytest.mark.parametrize("framing", SMUGGLING, ids=repr)
def test_request_smuggling_attempts_are_400_and_reach_nobody(
    rig: Rig, framing: list[tuple[str, str]]
) -> None:
    sbx = make(rig)
    before = rig.upstream.requests
    smuggled = b"0\r\n\r\nGET /echo?smuggled=1 HTTP/1.1\r\nHost: x\r\n\r\n"
    raw = head("POST", "/echo", authority(rig.proxy), [*routed(rig, sbx), *framing]) + smuggled
    with connect(rig.proxy) as sock:
        sock.sendall(raw)
        answer = read_answer(sock)
        assert answer.status == 400, (answer.status, answer.body[:200])
        assert answer.json()["code"] == 400
        assert closed_by_peer(sock)
    assert rig.upstream.requests == before  # neither the request nor the smuggled one


@pytest.mark.parametrize(
    "bad",
    [
        ("X-Evil", "a\x00b"),
        ("X-Evil\x00", "a"),
        ("X-Evil", "a\rInjected: yes"),
        ("Bad Name", "a"),
    ],
    ids=["nul-value", "nul-name", "bare-cr", "space-in-name"],
)
def test_nul_bytes_and_broken_headers_are_400(rig: Rig, bad: tuple[str, str]) -> None:
    sbx = make(rig)
    before = rig.upstream.requests
    answer = exchange(
        rig.proxy, head("GET", "/echo", authority(rig.proxy), [*routed(rig, sbx), bad])
    )
    assert answer.status == 400
    assert answer.json()["code"] == 400
    assert rig.upstream.requests == before


def test_oversized_and_numerous_headers_are_431_before_the_fast_path(rig: Rig) -> None:
    sbx = make(rig)
    before = rig.upstream.requests
    huge = head("GET", "/echo", authority(rig.proxy), [*routed(rig, sbx), ("X-Big", "a" * 20000)])
    assert exchange(rig.proxy, huge).status == 431
    many = [*routed(rig, sbx), *((f"X-{i}", "v") for i in range(150))]
    assert exchange(rig.proxy, head("GET", "/echo", authority(rig.proxy), many)).status == 431
    assert rig.upstream.requests == before


# ---- small limits: slow heads and bodies ----------------------------------------------------

SMALL = HttpLimits(header_timeout=1.0, body_idle_timeout=1.0)


@pytest.fixture
def small() -> Iterator[Guarded]:
    with guarded_proxy(HOSTILE_HOST, SMALL) as proxy:
        yield proxy


def test_slowloris_head_is_408_while_fast_requests_flow(
    small: Guarded,
) -> None:
    url, sbx, port, _ = small
    headers = to(sbx, port)
    with connect(url) as slow:
        slow.sendall(b"GET /echo HTTP/1.1\r\nHost: x\r\nX-A: ")
        with httpx.Client(timeout=30) as client:
            assert client.get(f"{url}/echo", headers=headers).status_code == 200
        answer = read_answer(slow)
    assert answer.status == 408
    assert answer.json()["code"] == 408


def test_a_body_that_stops_short_is_408_and_the_sandbox_sees_nothing(
    small: Guarded,
) -> None:
    url, sbx, port, state = small
    raw = head("POST", "/echo", authority(url), [*to(sbx, port).items(), ("Content-Length", "10")])
    with connect(url) as sock:
        sock.sendall(raw + b"12345")  # then nothing: the body idle deadline (1 s)
        answer = read_answer(sock)
    assert answer.status == 408
    assert answer.json()["code"] == 408
    assert state.requests == 0  # a small body is read in full before anything is forwarded


# ---- a hostile sandbox ----------------------------------------------------------------------

HOSTILE = {
    b"/conflict": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nspoof!",
    b"/nul": b"HTTP/1.1 200 OK\r\nX-Evil: a\x00b\r\nContent-Length: 2\r\n\r\nok",
    b"/split": b"HTTP/1.1 200 OK\r\nX-Evil: a\rSet-Cookie: x=1\r\nContent-Length: 2\r\n\r\nok",
    b"/endless-head": b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * (2 * 1024 * 1024),
    b"/short": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this",
    # a stream the sandbox stops in the middle (its pod killed): no last chunk
    b"/chunked-cut": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
    b"/garbage": b"\x00\x01\x02 not http at all\r\n\r\n",
    # two answers to one request: the second must never reach the client (it would answer the
    # client's next request on that connection, perhaps one for another sandbox)
    b"/two": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nspoof",
}


# "/stale": answered with keep-alive, then the next request on that connection is read and the
# connection closed without a byte of answer (a keep-alive connection the sandbox dropped).
DROPPED: list[bytes] = []


class _Hostile(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(10)
        path = self._path(sock)
        if path is None:
            return
        if path == b"/stale":
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nfine")
            if (again := self._path(sock)) is not None:
                DROPPED.append(again)
            return  # closed unanswered
        answer = HOSTILE.get(path, b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nfine")
        try:
            sock.sendall(answer)
        except OSError:
            return
        if path != b"/":
            sock.close()  # answered once: nothing to reuse

    @staticmethod
    def _path(sock: socket.socket) -> bytes | None:
        data = b""
        while b"\r\n\r\n" not in data:
            try:
                chunk = sock.recv(65536)
            except OSError:
                return None
            if not chunk:
                return None
            data += chunk
        return data.split(b" ", 2)[1].split(b"?")[0]


@pytest.fixture
def hostile(rig: Rig) -> Iterator[tuple[Rig, SandboxRecord, int]]:
    server = socketserver.ThreadingTCPServer((rig.pod_host, 0), _Hostile)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rig, make(rig), server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("path", ["/conflict", "/nul", "/split", "/endless-head", "/garbage"])
def test_a_hostile_answer_is_502_and_does_not_poison_the_connection(
    hostile: tuple[Rig, SandboxRecord, int], path: str
) -> None:
    rig, sbx, port = hostile
    host = authority(rig.proxy)
    with connect(rig.proxy) as sock:
        sock.sendall(head("GET", path, host, list(to(sbx, port).items())))
        answer = read_answer(sock)
        assert answer.status == 502, (answer.status, answer.body[:200])
        assert answer.json()["code"] == 502
        assert b"spoof" not in answer.body
        assert "set-cookie" not in answer.headers
        # the same client connection still speaks clean HTTP: nothing of the hostile answer
        # (a smuggled second response) is left in it
        if answer.headers.get("connection") == "close":
            assert closed_by_peer(sock)
        else:
            sock.sendall(head("GET", "/", host, list(to(sbx, port).items())))
            after = read_answer(sock)
            assert (after.status, after.body) == (200, b"fine")


@pytest.mark.parametrize("fast", [True, False], ids=["relay", "asgi-path"])
def test_a_second_answer_to_one_request_is_dropped(
    hostile: tuple[Rig, SandboxRecord, int], fast: bool
) -> None:
    rig, sbx, port = hostile
    headers = list(to(sbx, port).items()) + ([] if fast else [("X-API-KEY", "alice-key")])
    host = authority(rig.proxy)
    with connect(rig.proxy) as sock:
        sock.sendall(head("GET", "/two", host, headers))
        answer = read_answer(sock)
        assert (answer.status, answer.body) == (200, b"ok")
        sock.sendall(head("GET", "/", host, headers))
        data = b""
        while b"fine" not in data and (chunk := sock.recv(65536)):
            data += chunk
    assert b"spoof" not in data
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert data.endswith(b"\r\n\r\nfine")


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "asgi-path"])
def test_a_dropped_keep_alive_connection_is_retried_once_on_a_new_one(
    hostile: tuple[Rig, SandboxRecord, int], fast: bool
) -> None:
    """The sandbox saw the request on the stale connection but answered nothing, so the proxy
    sends it once more on a new connection; the client sees one ordinary answer."""
    rig, sbx, port = hostile
    headers = to(sbx, port) | ({} if fast else {"X-API-KEY": "alice-key"})  # a key: ASGI path
    DROPPED.clear()
    before = fast_count(rig.app)
    with httpx.Client(timeout=10) as client:
        first = client.get(f"{rig.proxy}/stale", headers=headers)  # its connection is pooled
        second = client.get(f"{rig.proxy}/stale?n=2", headers=headers)
    assert (first.status_code, first.text) == (200, "fine")
    assert (second.status_code, second.text) == (200, "fine")
    assert DROPPED == [b"/stale"]  # the second request reached the dropped connection first
    assert (fast_count(rig.app) - before == 2) is fast


def test_a_body_cut_short_closes_the_client_connection(
    hostile: tuple[Rig, SandboxRecord, int],
) -> None:
    rig, sbx, port = hostile
    with connect(rig.proxy) as sock:
        sock.sendall(head("GET", "/short", authority(rig.proxy), list(to(sbx, port).items())))
        answer = _read_all(sock)
    # the head says 100 bytes; the client gets fewer and a closed connection, never a body
    # padded or completed by the next exchange
    assert answer.status == 200
    assert answer.body == b"only this"


@pytest.mark.parametrize("way", ["relay", "fast-path", "asgi-path"])
def test_a_chunked_answer_cut_short_reaches_the_client_broken(
    hostile: tuple[Rig, SandboxRecord, int], way: str
) -> None:
    """The sandbox stops mid-answer: the client gets what came, then a closed connection without
    the last chunk, so it sees a broken answer (an SDK: a network error, a command stream
    without its end), never a complete one that silently lacks the sandbox's tail."""
    rig, sbx, port = hostile
    headers = list(to(sbx, port).items())
    if way == "asgi-path":
        headers.append(("X-API-KEY", "alice-key"))  # a key: the ASGI app decides
    raw = head("GET", "/chunked-cut", authority(rig.proxy), headers)
    before = fast_count(rig.app)
    with connect(rig.proxy) as sock:
        if way == "fast-path":  # a head in two pieces goes to uvicorn's protocol, then fast
            sock.sendall(raw[:10])
            time.sleep(0.2)
            sock.sendall(raw[10:])
        else:
            sock.sendall(raw)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head_part, _, body = data.partition(b"\r\n\r\n")
    assert head_part.startswith(b"HTTP/1.1 200"), data[:200]
    assert b"transfer-encoding: chunked" in head_part.lower()
    assert body == b"5\r\nhello\r\n", body  # what came, and no "0\r\n\r\n" after it
    assert (fast_count(rig.app) > before) is (way != "asgi-path")
    with httpx.Client(timeout=10) as client, pytest.raises(httpx.RemoteProtocolError):
        client.get(f"{rig.proxy}/chunked-cut", headers=dict(headers))


def _read_all(sock: socket.socket) -> Answer:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head_part, _, body = data.partition(b"\r\n\r\n")
    lines = head_part.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return Answer(int(lines[0].split()[1]), headers, body)
