"""A header sent twice, for every header that routes, authorises or frames a request: which
value wins (or whether the request is refused), pinned for the relay and for the ASGI path it
hands over to, so an optimised header scan cannot change it. The first value wins for routing
and credentials; two Content-Lengths are refused; an API key sends the request to the ASGI
path, whose first key wins."""

from __future__ import annotations

from services.proxy.settings import ENVD_PORT
from tests.proxy.conftest import Rig
from tests.security.rawhttp import authority, connect, read_answer

from .test_proxy import make
from .test_relay import handovers, relayed


def send(rig: Rig, lines: list[str], body: bytes = b"") -> tuple[int, dict[str, object], bool]:
    """One raw request (its header lines as given, repeats kept): the status, the sandbox's
    echo (empty if it did not answer), and whether the relay served it (no handover)."""
    raw = ("\r\n".join(["GET /echo HTTP/1.1", *lines]) + "\r\n\r\n").encode("latin-1") + body
    before, handed = relayed(rig.app), handovers(rig.app)
    with connect(rig.proxy) as sock:
        sock.sendall(raw)
        answer = read_answer(sock)
    fast = relayed(rig.app) - before == 1 and handovers(rig.app) == handed
    seen = answer.json() if answer.status == 200 else {}
    return answer.status, seen, fast


def test_the_first_access_token_wins(rig: Rig) -> None:
    sbx = make(rig)
    host = f"Host: {authority(rig.proxy)}"
    route = [f"E2b-Sandbox-Id: {sbx.sandbox_id}", f"E2b-Sandbox-Port: {ENVD_PORT}"]
    right, wrong = f"X-Access-Token: {sbx.envd_access_token}", "X-Access-Token: nope"
    status, seen, fast = send(rig, [host, *route, right, wrong])
    assert (status, fast) == (200, True)
    tokens = [v for k, v in seen["header_list"] if k == "x-access-token"]  # type: ignore[attr-defined]
    assert tokens == [sbx.envd_access_token, "nope"]  # forwarded as sent: the daemon checks too
    status, _, fast = send(rig, [host, *route, wrong, right])
    assert status == 401


def test_the_first_sandbox_id_wins(rig: Rig) -> None:
    mine, theirs = make(rig), make(rig, owner="bob")
    host = f"Host: {authority(rig.proxy)}"
    token = f"X-Access-Token: {mine.envd_access_token}"
    port = f"E2b-Sandbox-Port: {ENVD_PORT}"
    ids = [f"E2b-Sandbox-Id: {mine.sandbox_id}", f"E2b-Sandbox-Id: {theirs.sandbox_id}"]
    status, seen, fast = send(rig, [host, *ids, port, token])
    assert (status, fast) == (200, True)
    assert "e2b-sandbox-id" not in seen["headers"]  # type: ignore[operator]
    status, _, _ = send(rig, [host, *ids[::-1], port, token])
    assert status == 401
    # a garbled first id is not skipped for a good second one
    status, _, fast = send(rig, [host, "E2b-Sandbox-Id: --ro-bind", ids[0], port, token])
    assert status == 400
    assert not fast


def test_the_first_sandbox_port_wins(rig: Rig) -> None:
    """No token: the user port is public, the daemon port is not."""
    sbx = make(rig)
    host = f"Host: {authority(rig.proxy)}"
    sid = f"E2b-Sandbox-Id: {sbx.sandbox_id}"
    ports = [f"E2b-Sandbox-Port: {rig.user_port}", f"E2b-Sandbox-Port: {ENVD_PORT}"]
    status, _, fast = send(rig, [host, sid, *ports])
    assert (status, fast) == (200, True)
    status, _, _ = send(rig, [host, sid, *ports[::-1]])
    assert status == 401
    status, _, fast = send(rig, [host, sid, "E2b-Sandbox-Port: 99999", ports[0]])
    assert status == 400
    assert not fast


def test_the_first_host_routes_and_the_last_is_forwarded(rig: Rig) -> None:
    sbx = make(rig)
    routed = f"Host: {rig.user_port}-{sbx.sandbox_id}.sandbox.example"
    other = "Host: other.example"
    status, seen, fast = send(rig, [routed, other])
    assert (status, fast) == (200, True)
    forwarded = [v for k, v in seen["header_list"] if k == "x-forwarded-host"]  # type: ignore[attr-defined]
    assert forwarded == ["other.example"]
    hosts = [v for k, v in seen["header_list"] if k == "host"]  # type: ignore[attr-defined]
    assert len(hosts) == 1
    assert hosts[0].endswith(f":{rig.user_port}")  # the sandbox's own address, not the client's
    status, _, fast = send(rig, [other, routed])
    assert status != 200  # names no sandbox: the proxy's own answer, the sandbox sees nothing
    assert not fast


def test_two_content_lengths_are_refused(rig: Rig) -> None:
    sbx = make(rig)
    host = f"Host: {authority(rig.proxy)}"
    route = [f"E2b-Sandbox-Id: {sbx.sandbox_id}", f"E2b-Sandbox-Port: {rig.user_port}"]
    before = rig.upstream.requests
    for lengths in (["2", "2"], ["2", "3"], ["0", "2"]):
        framing = [f"Content-Length: {n}" for n in lengths]
        status, _, fast = send(rig, [host, *route, *framing], b"abc")
        assert (status, fast) == (400, False), lengths
    assert rig.upstream.requests == before


def test_the_first_api_key_wins_on_the_asgi_path(rig: Rig) -> None:
    theirs = make(rig, owner="bob")
    host = f"Host: {authority(rig.proxy)}"
    route = [f"E2b-Sandbox-Id: {theirs.sandbox_id}", f"E2b-Sandbox-Port: {ENVD_PORT}"]
    keys = ["X-API-Key: bob-key", "X-API-Key: alice-key"]
    status, seen, fast = send(rig, [host, *route, *keys])
    assert (status, fast) == (200, False)
    assert "x-api-key" not in seen["headers"]  # type: ignore[operator]
    status, _, fast = send(rig, [host, *route, *keys[::-1]])
    assert (status, fast) == (404, False)
    # a key, even a wrong one, is never skipped for the relay's token check
    token = f"X-Access-Token: {theirs.envd_access_token}"
    status, _, fast = send(rig, [host, *route, token, "X-API-Key: bad"])
    assert (status, fast) == (401, False)
