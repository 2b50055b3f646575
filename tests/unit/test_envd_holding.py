"""The one rule for what the daemon serves while a pause holds the sandbox
(``services.envd.holding``), checked against the generated Connect services themselves: every
method is either on the allow-list of reads or refused, the list names no method that does not
exist (a typo would refuse a read, or worse, silently allow nothing), and the methods that write
are exactly the expected ones. A method added to the protos later is refused until decided."""

from __future__ import annotations

from typing import Any

import pytest

from services.envd.gen.filesystem.filesystem_connect import FilesystemASGIApplication
from services.envd.gen.process.process_connect import ProcessASGIApplication
from services.envd.holding import _RPC_READS, allowed_while_held


class _AnyHandler:
    def __getattr__(self, name: str) -> Any:
        return lambda *a: None


def _methods() -> set[str]:
    found: set[str] = set()
    for app in (ProcessASGIApplication, FilesystemASGIApplication):
        found |= set(app(_AnyHandler())._endpoints(_AnyHandler()))  # type: ignore[arg-type]
    return found


def test_every_connect_method_is_decided_and_writes_are_refused() -> None:
    methods = _methods()
    assert _RPC_READS <= methods, _RPC_READS - methods
    refused = {m for m in methods if not allowed_while_held("POST", m)}
    assert refused == {
        "/filesystem.Filesystem/MakeDir",
        "/filesystem.Filesystem/Move",
        "/filesystem.Filesystem/Remove",
        "/process.Process/Start",
        "/process.Process/Update",
        "/process.Process/StreamInput",
        "/process.Process/SendInput",
        "/process.Process/SendSignal",
        "/process.Process/CloseStdin",
    }


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/files"),
        ("PUT", "/files"),
        ("DELETE", "/files"),
        ("POST", "/files/"),
        ("GET", "/files/"),
        ("GET", "//files"),
        ("get", "/files"),
        ("POST", "/init"),
        ("POST", "/kept-files"),
        ("GET", "/kept-files/thaw"),
        ("POST", "/process.Process/start"),
        ("POST", "/process.Process/List/"),
        ("POST", "/process.Process/List\x00"),
        ("POST", "/nowhere"),
    ],
)
def test_anything_not_on_the_list_is_refused(method: str, path: str) -> None:
    assert not allowed_while_held(method, path)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/files"),
        ("GET", "/kept-files"),
        ("POST", "/kept-files/thaw"),
        ("GET", "/health"),
        ("GET", "/metrics"),
        ("POST", "/process.Process/List"),
        ("POST", "/filesystem.Filesystem/Stat"),
    ],
)
def test_reads_pass(method: str, path: str) -> None:
    assert allowed_while_held(method, path)
