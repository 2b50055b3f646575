"""envd 0.6.x behaviour of the daemon, through the unmodified SDK (and raw HTTP for what the SDK
would refuse to send): file metadata (0.6.2), entries in watch events (0.6.3), watches with
``allow_network_mounts`` (0.6.4), removing a missing path, E2B's watch sequence of an upload,
``deadline_exceeded`` at a command's deadline, and streams breaking when the daemon stops."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest
from e2b import CommandExitException, FilesystemEventType, Sandbox
from e2b.exceptions import InvalidArgumentException

from services.envd import filesystem_service
from tests.envd.conftest import TOKEN, Daemon, start_daemon, stop_daemon
from tests.support.e2b_checks import assert_deadline_times_out, uploaded_entry


def _raw_upload(daemon: Daemon, path: str, headers: list[bytes]) -> tuple[int, bytes]:
    """An upload with header bytes no HTTP client library would send."""
    head = (
        f"POST /files?path={path} HTTP/1.1\r\nHost: x\r\nX-Access-Token: {TOKEN}\r\n"
        "Content-Type: application/octet-stream\r\nContent-Length: 4\r\nConnection: close\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall(head + b"".join(h + b"\r\n" for h in headers) + b"\r\ndata")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    status = int(reply.split(b" ", 2)[1])
    return status, reply.partition(b"\r\n\r\n")[2]


def _upload(daemon: Daemon, path: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(
        f"{daemon.url}/files",
        params={"path": path},
        content=b"data",
        headers={"X-Access-Token": TOKEN, "Content-Type": "application/octet-stream", **headers},
        timeout=10,
    )


def test_metadata_round_trip(sbx: Sandbox, daemon: Daemon) -> None:
    meta = {"author": "mish", "purpose": "upload"}
    assert sbx.files.write("meta/a.txt", "x", metadata=meta).metadata == meta
    assert sbx.files.write("meta/b.txt", "x", metadata=meta, use_octet_stream=True).metadata == meta
    assert sbx.files.get_info("meta/a.txt").metadata == meta
    assert sbx.files.get_info("meta/b.txt").metadata == meta
    assert os.getxattr(daemon.root / "meta/a.txt", "user.e2b.author") == b"mish"
    listed = {e.name: e.metadata for e in sbx.files.list("meta")}
    assert listed == {"a.txt": meta, "b.txt": meta}
    assert sbx.files.rename("meta/a.txt", "meta/c.txt").metadata == meta
    # Overwriting without metadata clears it; a file never given any has none.
    assert sbx.files.write("meta/c.txt", "y").metadata is None
    assert sbx.files.get_info("meta/c.txt").metadata is None
    assert sbx.files.write("meta/plain.txt", "z").metadata is None
    assert sbx.files.get_info("meta/plain.txt").metadata is None


def test_metadata_set_out_of_band_is_surfaced(sbx: Sandbox, daemon: Daemon) -> None:
    sbx.files.write("oob.txt", "x")
    sbx.commands.run("python3 -c \"import os; os.setxattr('oob.txt', 'user.e2b.Tag', b'v1')\"")
    sbx.commands.run("python3 -c \"import os; os.setxattr('oob.txt', 'user.other', b'no')\"")
    assert sbx.files.get_info("oob.txt").metadata == {"Tag": "v1"}


def test_metadata_keys_are_lowercased(daemon: Daemon) -> None:
    r = _upload(daemon, "case.txt", {"X-Metadata-Author": "Mish"})
    assert r.status_code == 200
    assert r.json()[0]["metadata"] == {"author": "Mish"}


@pytest.mark.parametrize(
    ("header", "why"),
    [
        (b"X-Metadata-good: bad\x01value", "control character"),
        (b"X-Metadata-good: bad\x00value", "NUL byte"),
        (b"X-Metadata-good: caf\xc3\xa9", "non-ASCII"),
        (b"X-Metadata-a(b): v", "not an HTTP token"),
        (b"X-Metadata-a\x00b: v", "NUL in the key"),
    ],
)
def test_hostile_metadata_bytes_rejected(daemon: Daemon, header: bytes, why: str) -> None:
    status, _body = _raw_upload(daemon, "hostile/raw.txt", [header])
    assert status == 400, why
    assert not (daemon.root / "hostile/raw.txt").exists()


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ({"X-Metadata-" + "k" * 300: "v"}, "key longer than an xattr name"),
        ({f"X-Metadata-k{i}": "v" for i in range(65)}, "too many keys"),
        ({"X-Metadata-big": "v" * 4000}, "too large"),
    ],
)
def test_hostile_metadata_rejected_and_nothing_written(
    daemon: Daemon, headers: dict[str, str], why: str
) -> None:
    r = _upload(daemon, "hostile/meta.txt", headers)
    assert r.status_code == 400, why
    assert "metadata" in r.json()["message"]
    assert not (daemon.root / "hostile/meta.txt").exists()


def test_option_looking_metadata_is_data(daemon: Daemon) -> None:
    r = _upload(daemon, "opt.txt", {"X-Metadata---ro-bind": "--ro-bind / /"})
    assert r.status_code == 200
    assert os.getxattr(daemon.root / "opt.txt", "user.e2b.--ro-bind") == b"--ro-bind / /"


def test_sdk_rejects_invalid_metadata_before_upload(sbx: Sandbox, daemon: Daemon) -> None:
    with pytest.raises(InvalidArgumentException):
        sbx.files.write("never.txt", "x", metadata={"bad key": "v"})
    assert not (daemon.root / "never.txt").exists()


def test_remove_of_a_missing_path_succeeds(sbx: Sandbox) -> None:
    sbx.files.remove("does/not/exist.txt")
    sbx.files.write("gone.txt", "x")
    sbx.files.remove("gone.txt")
    sbx.files.remove("gone.txt")
    assert not sbx.files.exists("gone.txt")


def test_upload_watch_sequence_and_entry(sbx: Sandbox, daemon: Daemon) -> None:
    (daemon.root / "w").mkdir()
    handle = sbx.files.watch_dir("w", include_entry=True, allow_network_mounts=True)
    sbx.files.write("w/new.txt", "content")
    # No sleep: the daemon drains what the kernel queued.
    entry = uploaded_entry(handle.get_new_events(), "new.txt")
    assert entry.path == str(daemon.root / "w/new.txt")
    sbx.files.remove("w/new.txt")
    removed = handle.get_new_events()
    assert [(e.type, e.name) for e in removed] == [(FilesystemEventType.REMOVE, "new.txt")]
    assert removed[0].entry is None  # nothing left to describe
    handle.stop()


def test_watch_without_entry_has_none(sbx: Sandbox, daemon: Daemon) -> None:
    (daemon.root / "w2").mkdir()
    handle = sbx.files.watch_dir("w2")
    sbx.files.write("w2/f.txt", "x")
    events = handle.get_new_events()
    assert events
    assert all(e.entry is None for e in events)
    handle.stop()


def test_network_mount_needs_the_flag(
    sbx: Sandbox, daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's own check (statfs magic), run in-process with the magic faked: no network
    filesystem can be mounted on a test machine without privileges it may not have."""
    import asyncio

    from connectrpc.errors import ConnectError

    from services.envd.gen.filesystem import filesystem_pb as pb

    monkeypatch.setattr(filesystem_service, "is_network_filesystem", lambda _path: True)
    from services.envd.users import Users

    service = filesystem_service.FilesystemService(users=Users(fallback_home=str(daemon.root)))
    (daemon.root / "nfs").mkdir()

    class Context:  # what the service reads of a request: its headers (no Basic auth here)
        request_headers: dict[str, str] = {}

    async def create(allow: bool) -> str:
        request = pb.CreateWatcherRequest(path="nfs", allow_network_mounts=allow)
        reply = await service.create_watcher(request, Context())  # type: ignore[arg-type]
        return reply.watcher_id

    with pytest.raises(ConnectError) as info:
        asyncio.run(create(False))
    assert "allow_network_mounts" in info.value.message

    async def allowed() -> None:
        assert await create(True)
        service.close()

    asyncio.run(allowed())


def test_real_mounts_are_not_network(daemon: Daemon) -> None:
    from services.envd.inotify import filesystem_magic, is_network_filesystem

    assert not is_network_filesystem(str(daemon.root))
    assert filesystem_magic("/proc") == 0x9FA0  # PROC_SUPER_MAGIC: the statfs read is right


def test_deadline_is_deadline_exceeded(sbx: Sandbox, daemon: Daemon) -> None:
    assert_deadline_times_out(sbx, "sleep 30; echo never > late2.txt", 1)
    time.sleep(0.5)
    assert not (daemon.root / "late2.txt").exists()


def test_stopping_daemon_breaks_running_streams(tmp_path: Path, control_plane: str) -> None:
    """SIGTERM to the daemon (what a pod's stop sends to every process in it, the commands
    included) must not end a running command's stream with a clean end event."""
    from e2b import Sandbox

    own = start_daemon(tmp_path, tmp_path.parent / f"{tmp_path.name}.log")
    try:
        sbx = Sandbox.create(
            template="sandbox-base", api_key="k", api_url=control_plane, sandbox_url=own.url
        )
        handle = sbx.commands.run("sleep 60", background=True, timeout=0)
        # The pod stop order: the daemon first, then its children.
        own.proc.send_signal(signal.SIGTERM)
        os.killpg(handle.pid, signal.SIGTERM)
        with pytest.raises(Exception) as info:
            handle.wait()
        assert not isinstance(info.value, CommandExitException), info.value
    finally:
        stop_daemon(own)


def test_killed_process_is_gone_when_kill_returns(sbx: Sandbox) -> None:
    for _ in range(5):  # a zombie left for the next request would show up in one of these
        handle = sbx.commands.run("sleep 30", background=True, timeout=0)
        assert sbx.commands.kill(handle.pid) is True
        with pytest.raises(CommandExitException):
            sbx.commands.run(f"kill -0 {handle.pid}")


def test_metrics_and_logs_of_the_daemon(daemon: Daemon, sbx: Sandbox) -> None:
    sbx.commands.run("true")
    headers = {"X-Access-Token": TOKEN}
    samples = httpx.get(f"{daemon.url}/metrics", headers=headers, timeout=10).json()
    assert samples, "a sample is taken when the daemon starts"
    s = samples[-1]
    assert set(s) == {
        "timestamp_unix", "cpu_count", "cpu_used_pct", "mem_used", "mem_total",
        "disk_used", "disk_total",
    }  # fmt: skip
    assert s["cpu_count"] >= 1 and 0 < s["mem_used"] <= s["mem_total"]
    assert 0 < s["disk_used"] <= s["disk_total"]
    future = httpx.get(
        f"{daemon.url}/metrics", params={"start": 2**40}, headers=headers, timeout=10
    )
    assert future.json() == []
    logs = httpx.get(f"{daemon.url}/logs", headers=headers, timeout=10).json()
    assert any("started pid" in e["message"] for e in logs)
    for path in ("/metrics", "/logs"):  # the token guards them like every other route
        assert httpx.get(f"{daemon.url}{path}", timeout=10).status_code == 401


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/metrics", {"start": "-1"}),
        ("/metrics", {"end": "abc"}),
        ("/metrics", {"start": str(10**30)}),
        ("/metrics", {"start": "--ro-bind"}),
        ("/metrics", {"end": "١٢"}),  # non-ASCII digits
        ("/logs", {"limit": "1001"}),
        ("/logs", {"cursor": "-5"}),
        ("/logs", {"direction": "up"}),
        ("/logs", {"level": "fatal"}),
        ("/logs", {"search": "x" * 257}),
    ],
)
def test_hostile_telemetry_queries(daemon: Daemon, path: str, params: dict[str, str]) -> None:
    r = httpx.get(
        f"{daemon.url}{path}", params=params, headers={"X-Access-Token": TOKEN}, timeout=10
    )
    assert r.status_code == 400
    assert next(iter(params)) in r.json()["message"]
