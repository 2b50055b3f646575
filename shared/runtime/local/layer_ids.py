"""The owners of template layers as stored on the host: shifted into a range no process runs as.

A template layer holds a sandbox's ids (0 = its root, 1000 = `user`) on disk as
``LAYER_BASE + id``: a range just below the first pod range (``userns.FIRST_BASE``), which no
workload is ever given and no real host user or subuid range reaches. So a file that left a layer
(or a layer folder another process reached) is owned by nobody who runs anything on the host: not
host root, not uid 1000. Pods see the sandbox's ids through the id-mapped mount of each layer
(``pod_dirs.mount_root``: a mapping namespace ``LAYER_BASE..`` → the pod's range).

A layer is stored shifted when :func:`store` has run on it (``commit`` of a built layer) and its
folder holds the mark ``ids`` (``LAYER_BASE`` in decimal). Layers of an older torpor, and the
cached layers a setup script builds with the sandbox's ids, carry no mark: :func:`mapping_start`
shifts them the first time a pod mounts them while no other pod does, and maps a layer another
pod still mounts unshifted as before, so a running sandbox never sees its files change owner.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import structlog

from shared.runtime.local import beneath

log = structlog.get_logger()

IDS = 65536  # userns.IDS_PER_POD (not imported: userns needs NATS)
LAYER_BASE = (1 << 30) - IDS  # userns.FIRST_BASE - IDS_PER_POD: the range below every pod's
MARK = "ids"
_LOCK = ".ids.lock"


def stored(value: int) -> int:
    """The on-disk id of sandbox id ``value`` (an id outside the sandbox's range: its root)."""
    if LAYER_BASE <= value < LAYER_BASE + IDS:
        return value  # stored already (a repeat after a crash finishes the job)
    return LAYER_BASE + value if 0 <= value < IDS else LAYER_BASE


def offset(tree: Path) -> int:
    """What to subtract from an on-disk id of ``tree`` (a layer's ``tree/``, or the rootfs) to
    get the sandbox's: ``LAYER_BASE`` for a stored layer, 0 for anything else."""
    return LAYER_BASE if is_stored(tree) else 0


def is_stored(tree: Path) -> bool:
    try:
        fd = os.open(tree.parent / MARK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        return f.read(32) == f"{LAYER_BASE}\n".encode()


def store(folder: Path) -> int:
    """Shift the owners of ``folder/tree`` into the layer range and mark ``folder``: a descriptor
    walk beneath the tree, never through a symlink; the number of entries changed."""
    with beneath.Dir.open(folder / "tree") as tree:
        changed = beneath.chown_tree(tree, lambda st: (stored(st.st_uid), stored(st.st_gid)))
    mark = folder / MARK
    fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(f"{LAYER_BASE}\n")
    return changed


@contextlib.contextmanager
def mapping_start(tree: Path) -> Iterator[int]:
    """The first on-disk id of ``tree`` that maps to the pod's root, for the block that mounts
    it: ``LAYER_BASE`` for a stored layer (an unmarked one is stored now, unless a running pod
    mounts it: 0 then, and the block holds the layer's lock, so no one shifts it between this
    answer and the mount)."""
    if is_stored(tree):
        yield LAYER_BASE
        return
    with beneath.flocked(tree.parent / _LOCK):
        if not is_stored(tree):
            if _mounted_by_a_pod(tree):
                log.info("runtime_local_layer_left_unshifted", layer=tree.parent.name)
                yield 0
                return
            changed = store(tree.parent)
            log.info("runtime_local_layer_ids_shifted", layer=tree.parent.name, entries=changed)
        yield LAYER_BASE


def _mounted_by_a_pod(tree: Path) -> bool:
    """Whether a pod's template lower (``pods/<uid>/lower-<i>``, an id-mapped clone of a tree:
    same device and inode) shows ``tree`` now."""
    want = os.stat(tree)
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        points = [line.split(" ")[4] for line in f if len(line.split(" ")) > 4]
    for point in points:
        name = point.rsplit("/", 1)[-1]
        if not name.startswith("lower-"):
            continue
        with contextlib.suppress(OSError):
            st = os.stat(_unescape(point))
            if stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
                return True
    return False


def _unescape(field: str) -> str:
    """A mountinfo path: the kernel writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
