"""Files of stored snapshots on the local runtime: ``<data dir>/snapshots/<snapshot id>/files``.

What is saved is the sandbox's own writable files: its kept layer (``layers.py``: everything it
changed on top of the rootfs, overlayfs whiteouts included) as ``files/layer``, and each of the
template's writable volumes that belong to this sandbox alone (``hostPath`` with
``{sandbox_id}``) as ``files/volume-<name>``; shared volumes are the same folder for every sandbox
that mounts them and are not copied. Owners are stored as the sandbox's own ids (host
``id_base + X`` kept as ``X``), because every sandbox has its own host id range: a restore shifts
them into the new sandbox's range. The folder is root's alone (0700); sandboxes never see it.

A running sandbox's layer is copied while its pod runs (read-only use of the upper dir: the
sandbox keeps running, as E2B's snapshots do; a file written during the copy may be caught
half-way). Copies never follow symlinks, go to a temporary folder renamed into place (a crash
leaves nothing or everything), and a repeated save finds its work done.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from shared.errors import Conflict, NotFound, RuntimeFailure
from shared.models.snapshot_records import is_snapshot_id
from shared.runtime.local import beneath
from shared.runtime.local.layers import Layers, copy_tree, id_shift

FILES = "files"
LAYER = "layer"
_PART_RE = re.compile(r"^volume-[a-z0-9][a-z0-9._-]{0,80}$")


def snapshot_dir(data_dir: Path, snapshot_id: str) -> Path:
    if not is_snapshot_id(snapshot_id):  # never a hostile string in a path
        raise NotFound(f"snapshot {snapshot_id!r} not found")
    return data_dir / "snapshots" / snapshot_id


def _copy_into(source: Path, target: Path, *, ids: Callable[[int], int]) -> None:
    """``source``'s contents into the folder ``target`` (clones where the filesystem can), owners
    through ``ids``; beneath both (``beneath``): a running sandbox swapping a folder for a
    symlink meanwhile cannot lead the copy out of its files."""
    copy_tree(source, target, ids=ids, what="copying files failed")


def _part(name: str) -> str:
    if not _PART_RE.match(name):
        raise RuntimeFailure(f"invalid files part {name!r}")
    return name


def save(
    data_dir: Path,
    snapshot_id: str,
    *,
    layer: contextlib.AbstractContextManager[Path] | None,
    volumes: Mapping[str, Path],
    id_base: int,
) -> int:
    """Copy the layer (entered to get its upper dir; ``None``: no layer to keep) and the
    volumes into the snapshot; the bytes stored. Idempotent: an existing copy is kept."""
    folder = snapshot_dir(data_dir, snapshot_id)
    final = folder / FILES
    if final.exists():
        return _size(final)
    folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.mkdir(mode=0o700, exist_ok=True)
    scratch = folder / f"{FILES}.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(mode=0o700)
    # The sandbox's own ids (0 = its root, 1000 = `user`), whatever range it had.
    own = id_shift(-id_base, base=0)
    if layer is not None:
        with layer as upper:
            (scratch / LAYER).mkdir(mode=0o755)
            _copy_into(upper, scratch / LAYER, ids=own)
    for name, source in volumes.items():
        if source.is_dir() and not source.is_symlink():
            (scratch / _part(name)).mkdir(mode=0o755)
            _copy_into(source, scratch / name, ids=own)
    scratch.rename(final)
    return _size(final)


def restore(
    data_dir: Path,
    snapshot_id: str,
    *,
    layers: Layers,
    name: str,
    id_base: int,
    disk_bytes: int | None,
    volumes: Mapping[str, Path],
) -> None:
    """Fill a new sandbox (its workload created, never run) from the snapshot: the layer (what
    a partial earlier attempt left is thrown away first) and its own volumes."""
    final = snapshot_dir(data_dir, snapshot_id) / FILES
    if not final.is_dir():
        raise NotFound(f"snapshot {snapshot_id} has no files (deleted?)")
    if (final / LAYER).is_dir():
        try:
            layers.restore(name, final / LAYER, base=id_base, disk_bytes=disk_bytes)
        except Conflict:  # not empty: an interrupted restore (no pod has run yet)
            layers.delete(name)
            layers.restore(name, final / LAYER, base=id_base, disk_bytes=disk_bytes)
    for part, target in volumes.items():
        source = final / _part(part)
        if not source.is_dir():
            continue
        target.mkdir(parents=True, exist_ok=True)
        # The folder itself keeps its owner and mode; what it holds is replaced.
        rules = beneath.CopyRules(ids=id_shift(id_base, base=id_base), merge=True, root_meta=False)
        try:
            with beneath.Dir.open(source) as src, beneath.Dir.open(target) as dst:
                beneath.copy_tree(src, dst, rules)
        except OSError as e:
            raise RuntimeFailure(
                f"restoring files failed: {e.strerror} ({e.filename!s:.120})"
            ) from e


def delete(data_dir: Path, snapshot_id: str) -> None:
    """Remove a snapshot's files (idempotent)."""
    with contextlib.suppress(NotFound):
        shutil.rmtree(snapshot_dir(data_dir, snapshot_id), ignore_errors=True)


def _size(root: Path) -> int:
    with beneath.Dir.open(root) as folder:
        return beneath.tree_bytes(folder)
