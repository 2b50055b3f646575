"""Path resolution shared by the filesystem RPCs and ``/files``.

Relative paths resolve against the daemon's root (``--root``, ``/workspace`` in a sandbox).
Absolute paths are taken as they are: the sandbox itself is the isolation boundary, as with real
envd. A ``..`` component or a NUL byte is refused outright, so a client cannot climb out of the
directory it names (``files.read("../../etc/shadow")``) by accident or on purpose.
"""

from __future__ import annotations

import os


class BadPath(ValueError):
    """The path is empty, contains NUL, or has a ``..`` component."""


def expand_user(path: str, home: str) -> str:
    if path == "~":
        return home
    if path.startswith("~/"):
        return os.path.join(home, path[2:])
    return path


def resolve(path: str, root: str, home: str | None = None) -> str:
    if not path:
        raise BadPath("path is empty")
    if "\x00" in path:
        raise BadPath("path contains a NUL byte")
    path = expand_user(path, home or root)
    if ".." in path.replace("\\", "/").split("/"):
        raise BadPath(f"path traversal is not allowed: {path!r}")
    joined = path if os.path.isabs(path) else os.path.join(root, path)
    return os.path.normpath(joined)
