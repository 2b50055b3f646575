"""Auth, malformed input and protocol edge cases, spoken as raw HTTP to the daemon."""

from __future__ import annotations

import json
import struct
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from e2b import AuthenticationException, Sandbox

from tests.conftest import skip_or_fail
from tests.envd.conftest import TOKEN, Daemon

AUTH = {"X-Access-Token": TOKEN}
UNARY = {**AUTH, "Content-Type": "application/json", "Connect-Protocol-Version": "1"}
STREAM = {**AUTH, "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}


def envelope(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def read_envelopes(body: bytes) -> list[tuple[int, dict[str, object]]]:
    out = []
    while body:
        flags, length = struct.unpack_from(">BI", body)
        out.append((flags, json.loads(body[5 : 5 + length])))
        body = body[5 + length :]
    return out


def test_wrong_access_token_rejected_for_sdk(daemon: Daemon, wrong_token_plane: str) -> None:
    sbx = Sandbox.connect(
        "sbx-wrong", api_key="k", api_url=wrong_token_plane, sandbox_url=daemon.url
    )
    with pytest.raises(AuthenticationException):
        sbx.commands.run("true")
    with pytest.raises(AuthenticationException):
        sbx.commands.list()
    with pytest.raises(AuthenticationException):
        sbx.files.read("anything")


def _unary(
    daemon: Daemon, method: str, body: bytes, headers: dict[str, str] | None = None
) -> httpx.Response:
    """A unary Connect call of the process service, as the SDK makes it (plus ``headers``)."""
    return httpx.post(
        f"{daemon.url}/process.Process/{method}", content=body, headers={**UNARY, **(headers or {})}
    )


def test_raw_auth(daemon: Daemon) -> None:
    assert httpx.get(f"{daemon.url}/health").status_code == 204  # health needs no token
    r = _unary(daemon, "List", b"{}", {"X-Access-Token": "nope"})
    assert r.status_code == 401
    assert r.json()["code"] == "unauthenticated"
    assert httpx.get(f"{daemon.url}/files", params={"path": "x"}).status_code == 401


def test_unknown_method_and_route(daemon: Daemon) -> None:
    r = _unary(daemon, "Nope", b"{}")
    assert r.status_code == 404
    r = httpx.get(f"{daemon.url}/nothing-here", headers=AUTH)
    assert r.status_code == 404
    assert r.json()["code"] == 404


def test_invalid_json_unary(daemon: Daemon) -> None:
    r = _unary(daemon, "List", b"{not json")
    assert r.status_code == 400
    assert r.json()["code"] == "invalid_argument"
    r = _unary(daemon, "SendSignal", b'{"process":{"pid":"abc"}}')
    assert r.json()["code"] == "invalid_argument"


def test_malformed_envelopes(daemon: Daemon) -> None:
    url = f"{daemon.url}/process.Process/Start"
    # Truncated envelope: announces 100 bytes, sends 5.
    r = httpx.post(url, content=struct.pack(">BI", 0, 100) + b"{}{}{", headers=STREAM, timeout=10)
    frames = read_envelopes(r.content)
    assert frames[-1][0] & 0x02
    assert "error" in frames[-1][1]
    # Invalid JSON inside a well-formed envelope.
    r = httpx.post(url, content=envelope(b"{oops"), headers=STREAM, timeout=10)
    frames = read_envelopes(r.content)
    assert frames[-1][1]["error"]["code"] == "invalid_argument"  # type: ignore[index]
    # No message at all.
    r = httpx.post(url, content=b"", headers=STREAM, timeout=10)
    assert "error" in read_envelopes(r.content)[-1][1]
    # Missing process config.
    r = httpx.post(url, content=envelope(b"{}"), headers=STREAM, timeout=10)
    assert read_envelopes(r.content)[-1][1]["error"]["code"] == "invalid_argument"  # type: ignore[index]


def test_oversized_message_rejected(daemon: Daemon) -> None:
    big = json.dumps({"process": {"pid": 1}, "input": {"stdin": "A" * (17 * 1024 * 1024)}})
    r = httpx.post(
        f"{daemon.url}/process.Process/SendInput", content=big.encode(), headers=UNARY, timeout=30
    )
    assert r.status_code != 200
    assert r.json()["code"] == "resource_exhausted"
    assert httpx.get(f"{daemon.url}/health").status_code == 204  # still alive


def test_start_streams_keepalives_and_end(daemon: Daemon) -> None:
    body = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", "sleep 0.5; echo hi"]}})
    r = httpx.post(
        f"{daemon.url}/process.Process/Start",
        content=envelope(body.encode()),
        headers={**STREAM, "Keepalive-Ping-Interval": "0.1"},
        timeout=10,
    )
    assert r.headers["content-type"] == "application/connect+json"
    frames = read_envelopes(r.content)
    events = [f[1].get("event", {}) for f in frames[:-1]]
    assert "start" in events[0]
    assert any("keepalive" in e for e in events)
    assert {"stdout": "aGkK"} in [e.get("data") for e in events]
    assert events[-1]["end"] == {"exited": True, "status": "exit status 0"}
    assert frames[-1] == (0x02, {})


def test_unknown_pid_is_not_found(daemon: Daemon) -> None:
    r = _unary(daemon, "SendSignal", b'{"process":{"pid":999999},"signal":"SIGNAL_SIGKILL"}')
    assert r.json()["code"] == "not_found"


def test_files_errors(daemon: Daemon) -> None:
    files = f"{daemon.url}/files"
    r = httpx.get(files, params={"path": "../etc/passwd"}, headers=AUTH)
    assert r.status_code == 400
    assert r.json()["code"] == 400
    r = httpx.get(files, params={"path": "missing.txt"}, headers=AUTH)
    assert r.status_code == 404
    r = httpx.post(
        files,
        params={"path": "x.bin"},
        content=b"not gzip",
        headers={**AUTH, "Content-Type": "application/octet-stream", "Content-Encoding": "gzip"},
    )
    assert r.status_code == 400
    assert r.json()["message"].startswith("invalid gzip body")
    r = httpx.post(
        files,
        content=b"--zz\r\nbroken",
        headers={**AUTH, "Content-Type": "multipart/form-data; boundary=zz"},
    )
    assert r.status_code == 400
    r = httpx.post(
        files,
        params={"path": "y.bin"},
        content=b"abc",
        headers={**AUTH, "Content-Type": "application/octet-stream"},
    )
    assert r.status_code == 200
    assert r.json() == [{"name": "y.bin", "type": "file", "path": str(daemon.root / "y.bin")}]


def test_files_out_of_space_is_507(daemon: Daemon) -> None:
    # /dev/full fails every write with ENOSPC. Uploads write in place, so the device is written
    # to (and refuses), never replaced.
    import os
    import stat

    if not os.path.exists("/dev/full") or not stat.S_ISCHR(os.stat("/dev/full").st_mode):
        skip_or_fail("no /dev/full character device")
    r = httpx.post(
        f"{daemon.url}/files",
        params={"path": "/dev/full"},
        content=b"abc",
        headers={**AUTH, "Content-Type": "application/octet-stream"},
    )
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    assert r.status_code == 507
    assert r.json()["code"] == 507


def test_init_and_envs(daemon: Daemon) -> None:
    r = httpx.post(f"{daemon.url}/init", json={"envVars": {"FROM_INIT": "yes"}}, headers=AUTH)
    assert r.status_code == 204
    assert httpx.get(f"{daemon.url}/envs", headers=AUTH).json()["FROM_INIT"] == "yes"
    r = httpx.post(f"{daemon.url}/init", content=b"[1,2", headers=AUTH)
    assert r.status_code == 400


def test_an_upload_in_flight_is_on_disk_as_far_as_it_has_come(daemon: Daemon) -> None:
    """A first piece smaller than a write buffer (10 bytes) is in the file while the client
    still holds the rest: an export waiting on the upload, or a reader, sees what arrived rather
    than a file short by what sat in envd's buffer (CI: the freeze test waited 15 s for it)."""
    target = daemon.root / "in-flight.bin"
    go = threading.Event()
    answers: list[httpx.Response] = []

    def body() -> Iterator[bytes]:
        yield b"0123456789"
        go.wait(30)
        yield b"the rest"

    def upload() -> None:
        answers.append(
            httpx.post(
                f"{daemon.url}/files",
                params={"path": str(target)},
                content=body(),
                headers={**AUTH, "Content-Type": "application/octet-stream"},
                timeout=60,
            )
        )

    uploading = threading.Thread(target=upload)
    uploading.start()
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if target.exists() and target.stat().st_size == 10:
                break
            time.sleep(0.02)
        assert target.exists() and target.read_bytes() == b"0123456789"
    finally:
        go.set()
        uploading.join(60)
    assert answers[0].status_code == 200, answers[0].text
    assert target.read_bytes() == b"0123456789the rest"
