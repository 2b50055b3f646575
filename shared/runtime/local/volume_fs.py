"""The data dir's ``volumes`` folder as a filesystem of its own, so that a pod's mount table
names no host path for a volume.

A volume is a read-write bind, and a bind's ``mountinfo`` root is the folder's path inside its
filesystem: on a data dir on the host's root filesystem that was ``<data dir>/volumes/<owner>/…``
in every pod (issue 32). The runtime mounts one overlayfs on ``volumes``, whose upper layer is
that same folder (an empty lower): the data stays where it is, on disk as before, and a volume
bound from it shows ``/<owner>/<id>``. One overlay per data dir, shared by every pod and by the
runtime's own work on volumes: no two overlays ever share the upper (which overlayfs leaves
undefined), and every pod's locks and inotify watches see the others'.

It stays mounted while any pod of the data dir may run (a runtime that leaves its pods running
keeps it for the next one, which finds it mounted), and goes with :func:`unmount` once every pod
is stopped. Where overlayfs cannot use the folder as an upper layer (a filesystem without
``trusted.*`` extended attributes, or an overlayfs), volumes stay plain binds (one log line).
A volume whose ``hostPath`` is absolute, or relative outside ``volumes/``, is a plain bind.
"""

from __future__ import annotations

from pathlib import Path

import structlog

from shared.errors import RuntimeFailure
from shared.runtime.local import mounts

log = structlog.get_logger()

FOLDER = "volumes"
_STATE = "volume-fs"  # <data dir>/volume-fs/{lower,work}: root's, 0700
_NAME = "torpor-volumes"


def root(data_dir: Path) -> Path:
    return data_dir / FOLDER


def mount(data_dir: Path) -> bool:
    """Mount the overlay on ``<data dir>/volumes`` unless it is (a runtime before this one left
    pods running); False when it cannot be (volumes are then plain binds)."""
    target = root(data_dir)
    if is_mounted(data_dir):
        return True
    state = data_dir / _STATE
    lower, work = state / "lower", state / "work"
    for folder, mode in ((state, 0o700), (lower, 0o755), (work, 0o700), (target, 0o755)):
        folder.mkdir(mode=mode, exist_ok=True)
    try:
        mounts.mount_upper_over_itself(lower, target, work, name=_NAME)
    except RuntimeFailure as e:
        log.warning("runtime_local_volume_fs_unavailable", error=str(e)[:300])
        return False
    return True


def is_mounted(data_dir: Path) -> bool:
    return mounts.is_mounted(root(data_dir))


def unmount(data_dir: Path) -> None:
    """Once no pod of the data dir runs: the volumes are plain folders again."""
    if is_mounted(data_dir):
        mounts.unmount(root(data_dir))
