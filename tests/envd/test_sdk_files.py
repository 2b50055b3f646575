"""The unmodified e2b SDK's ``files`` API against the daemon."""

from __future__ import annotations

import time

import pytest
from e2b import FileType, Sandbox
from e2b.exceptions import FileNotFoundException, InvalidArgumentException, SandboxException

from tests.envd.conftest import Daemon


def test_write_read_exists_remove(sbx: Sandbox, daemon: Daemon) -> None:
    info = sbx.files.write("notes/hello.txt", "hello world")
    assert info.path == str(daemon.root / "notes" / "hello.txt")
    assert (daemon.root / "notes" / "hello.txt").read_text() == "hello world"
    assert sbx.files.read("notes/hello.txt") == "hello world"
    assert sbx.files.read(str(daemon.root / "notes/hello.txt"), format="bytes") == b"hello world"
    assert sbx.files.exists("notes/hello.txt") is True
    sbx.files.remove("notes/hello.txt")
    assert sbx.files.exists("notes/hello.txt") is False
    with pytest.raises(FileNotFoundException):
        sbx.files.read("notes/hello.txt")


def test_binary_octet_stream_and_gzip(sbx: Sandbox, daemon: Daemon) -> None:
    payload = bytes(range(256)) * 1000
    sbx.files.write("bin/a.bin", payload, use_octet_stream=True)
    assert (daemon.root / "bin/a.bin").read_bytes() == payload
    sbx.files.write("bin/b.bin", payload, gzip=True)
    assert (daemon.root / "bin/b.bin").read_bytes() == payload
    assert bytes(sbx.files.read("bin/b.bin", format="bytes", gzip=True)) == payload


def test_write_files_multipart(sbx: Sandbox, daemon: Daemon) -> None:
    infos = sbx.files.write_files(
        [
            {"path": "multi/one.txt", "data": "1"},
            {"path": "multi/two.txt", "data": b"2"},
        ]
    )
    assert sorted(i.name for i in infos) == ["one.txt", "two.txt"]
    assert (daemon.root / "multi/two.txt").read_text() == "2"


def test_list_make_dir_rename(sbx: Sandbox, daemon: Daemon) -> None:
    assert sbx.files.make_dir("tree/a/b") is True
    assert sbx.files.make_dir("tree/a/b") is False  # ALREADY_EXISTS -> False
    sbx.files.write("tree/a/file.txt", "x")
    top = sbx.files.list("tree")
    assert [(e.name, e.type) for e in top] == [("a", FileType.DIR)]
    deep = sbx.files.list("tree", depth=3)
    assert {e.name for e in deep} == {"a", "b", "file.txt"}
    entry = sbx.files.rename("tree/a/file.txt", "tree/moved.txt")
    assert entry.path == str(daemon.root / "tree/moved.txt")
    assert (daemon.root / "tree/moved.txt").read_text() == "x"
    info = sbx.files.get_info("tree/moved.txt")
    assert info.type == FileType.FILE
    assert info.size == 1
    with pytest.raises(FileNotFoundException):
        sbx.files.list("does/not/exist")


def test_watch_dir(sbx: Sandbox, daemon: Daemon) -> None:
    (daemon.root / "watched").mkdir()
    handle = sbx.files.watch_dir("watched", recursive=True)
    sbx.files.write("watched/new.txt", "data")
    sbx.files.make_dir("watched/sub")
    sbx.files.write("watched/sub/deep.txt", "d")
    sbx.files.remove("watched/new.txt")
    seen: set[tuple[str, str]] = set()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        seen |= {(e.name, e.type.name) for e in handle.get_new_events()}
        if ("sub/deep.txt", "CREATE") in seen and ("new.txt", "REMOVE") in seen:
            break
        time.sleep(0.05)
    handle.stop()
    assert ("sub", "CREATE") in seen
    assert ("sub/deep.txt", "CREATE") in seen
    assert ("new.txt", "REMOVE") in seen
    with pytest.raises(SandboxException):
        handle.get_new_events()


def test_path_traversal_rejected(sbx: Sandbox) -> None:
    with pytest.raises((InvalidArgumentException, SandboxException)):
        sbx.files.read("../../../etc/passwd")
    with pytest.raises((InvalidArgumentException, SandboxException)):
        sbx.files.write("a/../../escape.txt", "x")
    with pytest.raises(InvalidArgumentException):
        sbx.files.list("../..")
