"""Where torpor's host caches live (built root filesystems, prebuilt layers): the folder an
environment variable names, else ``$XDG_CACHE_HOME/torpor/<name>`` (``~/.cache`` without it),
the folders the setup scripts build into."""

from __future__ import annotations

import os
from pathlib import Path


def cache_folder(env: str, name: str) -> Path:
    explicit = os.environ.get(env)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "torpor" / name
