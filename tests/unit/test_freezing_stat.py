"""The freezer's reading of ``/proc/<pid>/stat`` (``services.envd.freezing``): a process names
itself (``comm``, up to 15 bytes of anything); a name made to look like fields must not change
its state, parent or start time as the freezer sees them (a process posing as stopped would be
skipped, one posing as another's child would be chosen or spared wrongly)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.envd.freezing import Stat, read_stat

pytestmark = pytest.mark.unit

# Fields after the name: state ppid pgrp session tty tpgid flags ... starttime is field 22.
TAIL = "S 77 100 100 0 -1 4194560 " + " ".join(["0"] * 12) + " 555 0 0"


def _proc(tmp_path: Path, pid: int, name: str, tail: str = TAIL) -> str:
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "stat").write_bytes(f"{pid} ({name}) {tail}\n".encode())
    return str(tmp_path)


@pytest.mark.parametrize(
    "name",
    ["sleep", "a b", "x) T 1 1 1", ") T 1", "((()))", "--ro-bind", "\u00e9t\u00e9"],
)
def test_a_name_never_changes_the_fields(tmp_path: Path, name: str) -> None:
    proc = _proc(tmp_path, 4242, name)
    assert read_stat(4242, proc) == Stat(pid=4242, ppid=77, state="S", flags=4194560, start=555)


def test_a_missing_or_short_stat_is_none(tmp_path: Path) -> None:
    assert read_stat(1, str(tmp_path)) is None  # gone
    proc = _proc(tmp_path, 7, "cut", tail="S 1")
    assert read_stat(7, proc) is None
