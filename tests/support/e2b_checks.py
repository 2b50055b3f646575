"""What E2B's daemon does, checked once for the SDK tests that run against the whole stack
(tests/e2b_sdk) and against the daemon alone (tests/envd)."""

from __future__ import annotations

import pytest
from e2b import EntryInfo, FilesystemEvent, FilesystemEventType, FileType, Sandbox, TimeoutException


def uploaded_entry(events: list[FilesystemEvent], name: str) -> EntryInfo:
    """``events`` are the upload of file ``name``: CREATE, CHMOD, WRITE (as E2B's envd sends
    them), the last describing the file (a watch with ``include_entry``); that entry."""
    assert [(e.type, e.name) for e in events] == [
        (FilesystemEventType.CREATE, name),
        (FilesystemEventType.CHMOD, name),
        (FilesystemEventType.WRITE, name),
    ]
    entry = events[-1].entry
    assert entry is not None
    assert entry.type == FileType.FILE
    assert entry.name == name
    return entry


def assert_deadline_times_out(sbx: Sandbox, command: str, timeout: float) -> None:
    """``command`` past its ``timeout`` is a ``TimeoutException`` in the foreground, and so is
    reading a background ``sleep 30`` past it."""
    with pytest.raises(TimeoutException):
        sbx.commands.run(command, timeout=timeout)
    handle = sbx.commands.run("sleep 30", timeout=timeout, background=True)
    with pytest.raises(TimeoutException):
        for _ in handle:
            pass
