"""Template layers a setup script built outside every data dir, named ``cached:<name>`` in a
packaged template's ``layers`` (code-interpreter-v1's come from scripts/build-code-interpreter.sh):
the newest build under ``$TORPOR_LAYER_CACHE/<name>/current`` (default ``~/.cache/torpor/layers``),
a folder with ``tree/`` (the files, sandbox ids, overlayfs whiteouts, as a built layer) and
``done`` (written last). Resolved when a pod starts, so a rebuild never changes what a running
pod uses. Not built: one line naming the script."""

from __future__ import annotations

import re
from pathlib import Path

from shared.errors import RuntimeFailure
from shared.runtime.local.caches import cache_folder

PREFIX = "cached:"
ENV_CACHE = "TORPOR_LAYER_CACHE"
BUILD_HINT = "scripts/build-code-interpreter.sh (scripts/setup.sh runs it)"
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


def is_cached(key: str) -> bool:
    return key.startswith(PREFIX)


def cache_dir() -> Path:
    return cache_folder(ENV_CACHE, "layers")


def tree(key: str) -> Path:
    name = key.removeprefix(PREFIX)
    if not _NAME_RE.match(name):
        msg = f"invalid cached layer name {name[:80]!r}"
        raise RuntimeFailure(msg)
    found = (cache_dir() / name / "current").resolve()
    if not (found / "done").is_file() or not (found / "tree").is_dir():
        where = cache_dir() / name
        msg = f"the template layer {name!r} is not built (no {where}): run {BUILD_HINT}"
        raise RuntimeFailure(msg)
    return found / "tree"
