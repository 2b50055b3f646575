"""What a hostile test compares before and after: every entry of a host tree as it is on disk."""

from __future__ import annotations

import stat
from pathlib import Path

Entry = tuple[str, int, int, int, bytes]


def tree_state(path: Path) -> list[Entry]:
    """Every entry under ``path`` (itself included) with owner, group, mode and content.

    ``lstat`` throughout: a symlink is compared as a link, never followed.
    """
    out = []
    for entry in [path, *sorted(path.rglob("*"))]:
        st = entry.lstat()
        data = entry.read_bytes() if stat.S_ISREG(st.st_mode) else b""
        out.append((str(entry), st.st_uid, st.st_gid, st.st_mode, data))
    return out
