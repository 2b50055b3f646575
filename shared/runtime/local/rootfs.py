"""Where the sandbox root filesystem is: the Debian tree ``scripts/build-rootfs.sh`` builds.

``TORPOR_ROOTFS`` names one explicitly; otherwise the newest build in the cache
(``${TORPOR_ROOTFS_CACHE:-~/.cache/torpor/rootfs}/current``). A tree counts only when the build
finished (it writes ``etc/torpor-rootfs`` last). Without one the runtime does not start: one
line that says how to build it, never a pod on the host's ``/usr`` that lacks half of what a
sandbox promises (user ``user``, sudo, python, node).
"""

from __future__ import annotations

import os
from pathlib import Path

from shared.errors import ConfigError
from shared.runtime.local.caches import cache_folder

ENV_ROOTFS = "TORPOR_ROOTFS"
ENV_CACHE = "TORPOR_ROOTFS_CACHE"
MARKER = "etc/torpor-rootfs"
BUILD_HINT = (
    "build it with scripts/build-rootfs.sh (root, debootstrap, network access to deb.debian.org)"
)


def cache_dir() -> Path:
    return cache_folder(ENV_CACHE, "rootfs")


def locate(explicit: Path | None = None) -> Path:
    """The rootfs to run pods on, resolved (so a rebuild that moves ``current`` does not change
    what running pods use); ``ConfigError`` with a one-line hint when there is none."""
    configured = explicit or (Path(os.environ[ENV_ROOTFS]) if os.environ.get(ENV_ROOTFS) else None)
    path = configured or cache_dir() / "current"
    resolved = path.resolve()
    if not (resolved / MARKER).is_file():
        where = f"{ENV_ROOTFS}={configured}" if configured else f"no build in {cache_dir()}"
        msg = f"the sandbox root filesystem is missing ({where}): {BUILD_HINT}"
        raise ConfigError(msg)
    return resolved
