"""The proxy's compiled data path (``services/proxy/wire``, ``services.proxy.wire_link``), with
the production server, real sockets and the real ``torpor-wire`` process: a kept-alive
connection moves there after its first exchange; whatever it does not serve plainly comes back
to the Python proxy unanswered (hostile heads, another sandbox or token, a record that
changed); a hostile sandbox's malformed answer is a 502; its loss costs only its own
connections. Every case also asserts what the sandbox saw."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest

from services.proxy.app import ProxyApp, ProxyWiring
from services.proxy.settings import ENVD_PORT, ProxySettings
from services.proxy.wire_build import WireUnavailableError, find_or_build
from shared.domain.record import SandboxRecord
from shared.ports.lifecycle import CreateRequest
from shared.web.limits import HttpLimits
from tests.api.fakes import FakeKeys, FakeLifecycle, FakeRecords
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

from .test_proxy import to

WIRE_HOST = "127.0.4.216"  # this file's own upstream address (other proxy tests use .213-.215)
LIMITS = HttpLimits(max_connections_per_client=6)


def _binary_or_skip() -> None:
    try:
        find_or_build()
    except WireUnavailableError as e:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"no compiled data path here: {e}")


# ---- a sandbox that answers badly on purpose ------------------------------------------------

BAD_ANSWERS = {
    "/nul": b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-evil: a\x00b\r\n\r\nok",
    "/bare-lf": b"HTTP/1.1 200 OK\ncontent-length: 2\n\nok",
    "/cl-and-te": (
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n"
        b"2\r\nok\r\n0\r\n\r\n"
    ),
    "/two-lengths": b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok!",
    "/gzip-framing": b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nok",
    "/obs-fold": b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-a: b\r\n c\r\n\r\nok",
    "/huge-head": b"HTTP/1.1 200 OK\r\n" + b"x-pad: " + b"a" * 70000 + b"\r\n\r\nok",
    "/upgrade": b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\n\r\n",
    "/garbage": b"NOT HTTP AT ALL\r\n\r\n",
}
GOOD = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\nx-sandbox: yes\r\n\r\ngood"
CUT = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly-part"


class RawSandbox:
    """A sandbox port answering each request by its path with fixed bytes (then closing on a
    bad or cut answer), counting the requests that reach it."""

    def __init__(self, host: str) -> None:
        self.paths: list[str] = []
        self._server = socket.create_server((host, 0))
        self.port = self._server.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop = True
        self._server.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                request, _, buf = buf.partition(b"\r\n\r\n")
                path = request.split(b" ", 2)[1].decode()
                self.paths.append(path)
                if path in BAD_ANSWERS:
                    conn.sendall(BAD_ANSWERS[path])
                    return
                if path == "/cut":
                    conn.sendall(CUT)
                    return
                conn.sendall(GOOD)


# ---- the rig ------------------------------------------------------------------------------------


@dataclass
class WireRig:
    proxy: str
    app: ProxyApp
    lifecycle: FakeLifecycle
    upstream: UpstreamState
    user_port: int
    raw: RawSandbox

    def record(self, owner: str = "alice") -> SandboxRecord:
        return asyncio.run(self.lifecycle.create(CreateRequest(owner=owner, auto_resume=True)))


@pytest.fixture(scope="module")
def wire() -> Iterator[WireRig]:
    _binary_or_skip()
    state = UpstreamState()
    lifecycle = FakeLifecycle(host=WIRE_HOST, resume_delay=0.2)
    keys = FakeKeys()
    keys.add("alice-key", "alice")
    keys.add("bob-key", "bob")
    app = ProxyApp(
        ProxySettings(touch_interval=0.0, resume_wait=10, boot_grace=1.0),
        wiring=ProxyWiring(records=FakeRecords(lifecycle), lifecycle=lifecycle, keys=keys),
        limits=LIMITS,
    )
    raw = RawSandbox(WIRE_HOST)
    upstream = build_upstream(state)
    try:
        with (
            serve(upstream, host=WIRE_HOST, port=ENVD_PORT),
            serve(upstream, host=WIRE_HOST) as user_url,
            serve_guarded(app, LIMITS, timeout_keep_alive=30) as proxy_url,
        ):
            _eventually(lambda: app.wire_ready, "the proxy found its compiled data path")
            yield WireRig(
                proxy=proxy_url,
                app=app,
                lifecycle=lifecycle,
                upstream=state,
                user_port=int(user_url.rsplit(":", 1)[1]),
                raw=raw,
            )
    finally:
        raw.close()


def _eventually(check: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(0.02)


def wire_count(app: ProxyApp) -> float:
    return app.wire_exchanges._value.get()


def held(rig: WireRig) -> int:
    return rig.app.wire_held


@contextlib.contextmanager
def adopted(rig: WireRig, sbx: SandboxRecord, port: int | None = None) -> Iterator[socket.socket]:
    """A client connection whose first exchange is done: it is held by the compiled path."""
    before = adoptions(rig)
    with connect(rig.proxy) as sock:
        sock.sendall(head("GET", "/echo?n=0", authority(rig.proxy), _to(rig, sbx, port)))
        assert read_answer(sock).status == 200
        _eventually(lambda: adoptions(rig) != before, "the connection was handed over")
        yield sock


def adoptions(rig: WireRig) -> tuple[int, int]:
    """Which process, and how many connections it was handed (changes only on a hand-over)."""
    link = rig.app.wire
    return (0, 0) if link is None else (id(link), link.adoptions)


def _to(rig: WireRig, sbx: SandboxRecord, port: int | None = None) -> dict[str, str]:
    return to(sbx, rig.user_port if port is None else port)


# ---- what it serves ---------------------------------------------------------------------------


def test_a_kept_alive_connection_is_served_by_the_wire_as_by_the_proxy(wire: WireRig) -> None:
    sbx = wire.record()
    host = authority(wire.proxy)
    before, seen = wire_count(wire.app), wire.upstream.requests
    body = b"\x00\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n" * 100
    with adopted(wire, sbx) as sock:
        for i in range(1, 6):
            sock.sendall(head("GET", f"/echo?n={i}", host, _to(wire, sbx)))
            answer = read_answer(sock)
            assert answer.status == 200
            echoed = answer.json()
            assert echoed["query"] == f"n={i}"
            assert echoed["headers"]["x-forwarded-for"] == "127.0.0.1"
            assert echoed["headers"]["x-forwarded-host"] == host
            assert "e2b-sandbox-id" not in echoed["headers"]
            assert "e2b-sandbox-port" not in echoed["headers"]
        digest = head("POST", "/digest", host, {**_to(wire, sbx), "Content-Length": str(len(body))})
        sock.sendall(digest + body)
        assert read_answer(sock).json() == {
            "sha256": hashlib.sha256(body).hexdigest(),
            "size": len(body),
        }
        assert held(wire) >= 1
    _eventually(lambda: wire_count(wire.app) - before >= 6, "the wire reported its exchanges")
    assert wire.upstream.requests - seen == 6  # the first and five echoes (/digest not counted)
    assert b"/smuggled" not in b"".join(p.encode() for p in wire.raw.paths)


def test_a_streamed_answer_is_rechunked_whole_for_an_http_client(wire: WireRig) -> None:
    sbx = wire.record()
    before = wire_count(wire.app)
    with httpx.Client(timeout=30) as client:
        for size in (10, 300_000, 5_000_000):
            r = client.get(f"{wire.proxy}/big?size={size}", headers=_to(wire, sbx))
            assert r.status_code == 200
            assert r.headers.get("transfer-encoding") == "chunked"
            assert len(r.content) == size
    _eventually(lambda: wire_count(wire.app) - before >= 2, "the wire served the later ones")


def test_pipelined_requests_are_answered_in_order(wire: WireRig) -> None:
    sbx = wire.record()
    host = authority(wire.proxy)
    with adopted(wire, sbx) as sock:
        sock.sendall(b"".join(head("GET", f"/echo?n={i}", host, _to(wire, sbx)) for i in range(4)))
        answers = read_answers(sock, 4)
    assert [a.json()["query"] for a in answers] == [f"n={i}" for i in range(4)]


def test_activity_through_the_wire_touches_the_sandbox_but_health_does_not(
    wire: WireRig,
) -> None:
    sbx = wire.record()
    host = authority(wire.proxy)
    with adopted(wire, sbx, ENVD_PORT) as sock:
        wire.lifecycle.touches.clear()
        for _ in range(3):
            sock.sendall(head("GET", "/health", host, to(sbx)))
            assert read_answer(sock).status == 204  # the stand-in's /health
        time.sleep(0.6)  # three report rounds
        assert sbx.sandbox_id not in wire.lifecycle.touches
        sock.sendall(head("GET", "/echo", host, to(sbx)))
        assert read_answer(sock).status == 200
        _eventually(lambda: sbx.sandbox_id in wire.lifecycle.touches, "the sandbox was touched")


def test_a_body_slower_than_the_grace_goes_back_and_is_served(wire: WireRig) -> None:
    sbx = wire.record()
    host = authority(wire.proxy)
    body = b"0123456789" * 10
    with adopted(wire, sbx) as sock:
        holding = held(wire)
        sock.sendall(head("POST", "/digest", host, {**_to(wire, sbx), "Content-Length": "100"}))
        # over services.proxy.wire_link.BODY_GRACE: handed back (the count moves with it)
        _eventually(lambda: held(wire) == holding - 1, "the connection came back")
        sock.sendall(body)
        answer = read_answer(sock)
    assert answer.json() == {"sha256": hashlib.sha256(body).hexdigest(), "size": 100}


# ---- what goes back to the Python proxy ----------------------------------------------------------

HOSTILE: list[tuple[str, Callable[[str, dict[str, str]], bytes], set[int]]] = [
    ("nul", lambda h, r: head("GET", "/echo", h, {**r, "X-Evil": "a\x00b"}), {400}),
    (
        "cl-and-te",
        lambda h, r: (
            head("POST", "/echo", h, {**r, "Content-Length": "4", "Transfer-Encoding": "chunked"})
            + b"0\r\n\r\n"
        ),
        {400},
    ),
    (
        "two-lengths",
        lambda h, r: (
            head("POST", "/echo", h, [*r.items(), ("Content-Length", "1"), ("Content-Length", "2")])
            + b"ab"
        ),
        {400},
    ),
    (
        "bare-lf",
        lambda h, r: (
            b"GET /echo HTTP/1.1\nHost: "
            + h.encode()
            + b"\n"
            + b"".join(f"{k}: {v}\n".encode() for k, v in r.items())
            + b"\n"
        ),
        {400},
    ),
    (
        "obs-fold",
        lambda h, r: head("GET", "/echo", h, r)[:-2] + b"X-Folded: a\r\n b\r\n\r\n",
        {400},
    ),
    ("huge-header", lambda h, r: head("GET", "/echo", h, {**r, "X-Pad": "a" * 20000}), {431}),
    # absolute-form: the Python proxy's (uvicorn's) to take; it forwards the path
    ("absolute-form", lambda h, r: head("GET", "http://evil.example/echo", h, r), {200}),
]


@pytest.mark.parametrize(("name", "build", "statuses"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_request_on_a_held_connection_is_the_python_proxys_to_refuse(
    wire: WireRig,
    name: str,
    build: Callable[[str, dict[str, str]], bytes],
    statuses: set[int],
) -> None:
    """Held or fresh, the same bytes get the same answer and reach the sandbox (or not) the
    same way: the compiled path hands them back unanswered."""
    sbx = wire.record()
    host = authority(wire.proxy)
    with adopted(wire, sbx) as sock:
        seen = wire.upstream.requests
        sock.sendall(build(host, _to(wire, sbx)))
        answer = read_answer(sock)
        reached = wire.upstream.requests - seen
    assert answer.status in statuses, (name, answer.status, answer.body[:200])
    with connect(wire.proxy) as fresh:
        seen = wire.upstream.requests
        fresh.sendall(build(host, _to(wire, sbx)))
        assert read_answer(fresh).status == answer.status
        assert wire.upstream.requests - seen == reached
    if answer.status >= 400:
        assert reached == 0, f"{name} reached the sandbox"


def test_another_sandbox_or_token_on_a_held_connection_is_decided_again(wire: WireRig) -> None:
    mine, theirs = wire.record(), wire.record(owner="bob")
    host = authority(wire.proxy)
    with adopted(wire, mine, ENVD_PORT) as sock:
        seen = wire.upstream.requests
        stolen = {**to(theirs, token=False), "X-Access-Token": mine.envd_access_token or ""}
        sock.sendall(head("GET", "/echo?n=stolen", host, stolen))
        assert read_answer(sock).status == 401
        assert wire.upstream.requests == seen
    with adopted(wire, mine, ENVD_PORT) as sock:
        sock.sendall(head("GET", "/echo", host, {**to(mine, token=False), "X-Access-Token": "x"}))
        assert read_answer(sock).status == 401
    with adopted(wire, mine, ENVD_PORT) as sock:
        other_user = {**to(mine, token=False), "X-API-Key": "bob-key"}
        sock.sendall(head("GET", "/echo", host, other_user))
        assert read_answer(sock).status == 404
    with adopted(wire, mine, ENVD_PORT) as sock:  # a legitimate switch is served
        sock.sendall(head("GET", "/echo?n=theirs", host, to(theirs)))
        answer = read_answer(sock)
        assert answer.status == 200
        assert answer.json()["query"] == "n=theirs"
    assert wire.upstream.requests == seen + 4  # three first exchanges and the switch


def test_a_paused_sandbox_goes_back_and_wakes_up(wire: WireRig) -> None:
    """The record changes (paused): the held connection's next request is the Python proxy's,
    which resumes the sandbox. Without the change reaching the compiled path it would have
    gone straight to the (still listening) stand-in and no resume would be counted."""
    sbx = wire.record()
    host = authority(wire.proxy)
    with adopted(wire, sbx) as sock:
        resumes = wire.lifecycle.resume_calls
        asyncio.run(wire.lifecycle.pause(sbx.sandbox_id, owner=None))
        # The process applies the change as it reads it, as the proxy applies its KV watch's:
        # a request racing the change may still go to the sandbox. Not this one.
        time.sleep(0.5)
        sock.sendall(head("GET", "/echo?n=after", host, _to(wire, sbx)))
        answer = read_answer(sock)
    assert answer.status == 200
    assert answer.json()["query"] == "n=after"
    assert wire.lifecycle.resume_calls == resumes + 1


def test_a_hostile_sandbox_answer_through_the_wire_is_a_502(wire: WireRig) -> None:
    sbx = wire.record()
    host = authority(wire.proxy)
    for path in BAD_ANSWERS:
        with adopted(wire, sbx, wire.raw.port) as sock:
            sock.sendall(head("GET", path, host, _to(wire, sbx, wire.raw.port)))
            answer = read_answer(sock)
            assert answer.status == 502, (path, answer.status, answer.body[:100])
            assert answer.json()["code"] == 502
            assert b"\x00" not in answer.body
            assert closed_by_peer(sock)


def test_an_answer_cut_short_reaches_the_client_broken(wire: WireRig) -> None:
    sbx = wire.record()
    host = authority(wire.proxy)
    with adopted(wire, sbx, wire.raw.port) as sock:
        sock.sendall(head("GET", "/cut", host, _to(wire, sbx, wire.raw.port)))
        sock.settimeout(10)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    head_bytes, _, body = got.partition(b"\r\n\r\n")
    assert b"content-length: 100" in head_bytes.lower()
    assert body == b"only-part"  # then the close: never a complete-looking answer


# ---- limits and the process's loss ---------------------------------------------------------------


def test_held_connections_count_for_their_client(wire: WireRig) -> None:
    sbx = wire.record()
    with contextlib.ExitStack() as stack:
        for _ in range(LIMITS.max_connections_per_client):
            stack.enter_context(adopted(wire, sbx))
        with connect(wire.proxy) as extra:
            refused = read_answer(extra)
            assert refused.status == 503
    _eventually(lambda: held(wire) == 0, "closed connections were counted out")
    with adopted(wire, sbx):  # and the client may connect again
        pass


def test_a_killed_wire_loses_only_its_connections_and_comes_back(wire: WireRig) -> None:
    sbx = wire.record()
    host = authority(wire.proxy)
    with adopted(wire, sbx) as sock:
        link = wire.app.wire
        assert link is not None and link._proc is not None
        os.kill(link._proc.pid, signal.SIGKILL)
        assert closed_by_peer(sock)
        _eventually(lambda: not link.running, "the proxy saw the loss")
        assert held(wire) == 0
    with connect(wire.proxy) as fresh:  # served here meanwhile
        for _ in range(3):
            fresh.sendall(head("GET", "/echo", host, _to(wire, sbx)))
            assert read_answer(fresh).status == 200
    time.sleep(5.2)  # services.proxy.relay.WIRE_RESTART_DELAY
    with adopted(wire, sbx):
        new = wire.app.wire
        assert new is not None and new is not link and new.running
