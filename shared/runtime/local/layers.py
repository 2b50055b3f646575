"""A sandbox's writable layer: everything it changed on top of the shared rootfs, kept while the
sandbox is paused (template ``persist: layer``, the default) or thrown away with each pod
(``persist: none``, the seed's fresh disk).

Where it lives (the contract snapshot code builds on), per workload ``<name>``::

    <data dir>/layers/<name>/            0700, host root's
        disk.img    with a disk limit: a sparse ext4 image of ``resources.limits.disk`` bytes
        mnt/        the layer's filesystem: the image mounted (loop, nosuid, nodev) while in
                    use, a plain folder without a disk limit, a tmpfs for ``persist: none``
        mnt/upper/  overlayfs' upper dir: the sandbox's changed files, owned by its host id
                    range (uid 0 inside = ``id_base``, uid 1000 = ``id_base + 1000``),
                    with overlayfs whiteouts (0/0 character devices) for deleted files
        mnt/work/   overlayfs' work dir
        lock        flock(2) held while the layer is mounted or unmounted

:meth:`Layers.mounted` makes ``mnt/upper`` readable for a paused sandbox and puts it back as it
was; a copy of it must never follow symlinks (the sandbox wrote them). :meth:`Layers.export`
copies a paused sandbox's layer out (ids made the sandbox's own: host ``id_base + X`` becomes
``X``), :meth:`Layers.restore` fills a new sandbox's empty layer from such a copy (ids shifted
into its range): the snapshot code's port (``LocalRuntime.export_files`` / ``import_files``).
Deleting the workload (kill, retention) deletes the folder (:meth:`Layers.delete`).

Why an ext4 image for a disk limit: a write past it is ENOSPC inside the sandbox and nothing
else's disk fills up, and unlike the tmpfs it replaces, it costs no memory and survives the pod.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from enum import StrEnum
from pathlib import Path

from shared.errors import Conflict, RuntimeFailure
from shared.runtime.local import beneath, mounts

# A workload name (checked by LocalRuntime.create, and before any folder here): a DNS label.
_NAME_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
# Without a disk limit, ``persist: none`` still needs a size for its tmpfs.
DEFAULT_TMPFS_BYTES = 2 * 2**30
IDS_PER_SANDBOX = 65536  # userns.IDS_PER_POD (not imported: userns needs NATS)


def is_workload_name(name: str) -> bool:
    return _NAME_RE.fullmatch(name) is not None


class Persist(StrEnum):
    LAYER = "layer"
    NONE = "none"


class Layers:
    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "layers"

    def folder(self, name: str) -> Path:
        if not is_workload_name(name):
            msg = f"invalid workload name {name[:80]!r}"
            raise RuntimeFailure(msg)
        return self.root / name

    def upper(self, name: str) -> Path:
        return self.folder(name) / "mnt" / "upper"

    def open(
        self,
        name: str,
        *,
        base: int,
        disk_bytes: int | None,
        persist: Persist,
        holder: str | None = None,
    ) -> Path:
        """Mount (creating if needed) the layer of ``name``; returns its ``mnt`` folder, holding
        ``upper`` and ``work``. Idempotent while mounted. ``holder`` (a pod uid) is recorded:
        only that pod's :meth:`close` unmounts it."""
        folder = self.folder(name)
        self.root.mkdir(mode=0o700, exist_ok=True)
        if persist is Persist.NONE:
            self.delete(name)  # a fresh disk each time, whatever a crash left
        folder.mkdir(mode=0o700, exist_ok=True)
        mnt = folder / "mnt"
        mnt.mkdir(mode=0o700, exist_ok=True)
        with self._locked(folder):
            if not mounts.is_mounted(mnt):
                if persist is Persist.NONE:
                    mounts.mount_tmpfs(mnt, size=disk_bytes or DEFAULT_TMPFS_BYTES, owner=0)
                elif disk_bytes is not None:
                    _mount_image(folder / "disk.img", mnt, size=disk_bytes, base=base)
            for sub, owner, mode in (("upper", base, 0o755), ("work", 0, 0o700)):
                path = mnt / sub
                with contextlib.suppress(FileExistsError):
                    path.mkdir(mode=mode)
                st = os.lstat(path)
                if not stat.S_ISDIR(st.st_mode):
                    msg = f"the layer of {name} is damaged ({sub} is not a folder)"
                    raise RuntimeFailure(msg)
                if st.st_uid != owner:
                    os.chown(path, owner, owner, follow_symlinks=False)
            if holder is not None:
                (folder / "holder").write_text(holder)
        return mnt

    def close(self, name: str, *, persist: Persist, holder: str) -> None:
        """Pod ``holder`` is gone: unmount its layer (``persist: none``: delete it), unless a
        newer pod holds it by now."""
        folder = self.folder(name)
        if not folder.is_dir():
            return
        with self._locked(folder):
            try:
                current = (folder / "holder").read_text()
            except FileNotFoundError:
                current = holder
            if current != holder:
                return
        if persist is Persist.NONE:
            self.delete(name)
            return
        with self._locked(folder):
            mounts.unmount(folder / "mnt")
            with contextlib.suppress(FileNotFoundError):
                (folder / "holder").unlink()

    def delete(self, name: str) -> None:
        """The workload is gone: its kept files go too. Several runtimes may do it at once:
        one moves the folder aside (atomically) and removes it; the others find nothing."""
        folder = self.folder(name)
        try:
            mode = os.lstat(folder).st_mode
        except FileNotFoundError:
            return  # never made, or another runtime moved it aside (one look: no gap between)
        if not stat.S_ISDIR(mode):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(folder)
            return
        trash = self.root / f".deleted-{name}-{uuid.uuid4().hex[:8]}"
        try:
            with self._locked(folder):
                mounts.unmount(folder / "mnt")
                if mounts.is_mounted(folder / "mnt"):
                    msg = f"the layer of {name} is still mounted"
                    raise RuntimeFailure(msg)
                os.rename(folder, trash)
        except FileNotFoundError:
            return  # deleted by someone else meanwhile
        _remove_tree(trash)

    @contextlib.contextmanager
    def mounted(self, name: str, *, base: int, disk_bytes: int | None) -> Iterator[Path]:
        """``mnt/upper`` of a kept layer, mounted for the block (left mounted when a pod holds
        it already). Only for a paused sandbox or a running one (read-only use)."""
        folder = self.folder(name)
        was_mounted = mounts.is_mounted(folder / "mnt")
        mnt = self.open(name, base=base, disk_bytes=disk_bytes, persist=Persist.LAYER)
        try:
            yield mnt / "upper"
        finally:
            if not was_mounted:
                with self._locked(folder):
                    mounts.unmount(mnt)

    def export(self, name: str, dest: Path, *, base: int, disk_bytes: int | None) -> None:
        """Copy the kept layer of ``name`` (no pod may hold it) to ``dest``, a new folder: files,
        modes, xattrs, overlayfs whiteouts, never following symlinks; owners made the sandbox's
        own ids (0 = its root, 1000 = `user`)."""
        with self.mounted(name, base=base, disk_bytes=disk_bytes) as upper:
            dest.mkdir(mode=0o700)
            copy_tree(
                upper, dest, ids=id_shift(-base, base=0), what="cannot copy the sandbox's files"
            )

    def restore(self, name: str, source: Path, *, base: int, disk_bytes: int | None) -> None:
        """Fill the new, empty layer of ``name`` from ``source`` (an :meth:`export`), owners
        shifted into the sandbox's id range. Before its first pod."""
        with self.mounted(name, base=base, disk_bytes=disk_bytes) as upper:
            if any(os.scandir(upper)):
                msg = f"the layer of {name} is not empty"
                raise Conflict(msg)
            copy_tree(source, upper, ids=id_shift(base, base=base), what="cannot copy the files in")

    def hand_over(self, pool: str, name: str) -> None:
        """A warm pod's fresh layer becomes workload ``name``'s (its pod keeps using it: the
        mount moves with the folder). Idempotent; ``name`` must have no layer of its own."""
        old, new = self.folder(pool), self.folder(name)
        if not old.exists():
            if new.exists():
                return  # handed over before
            msg = f"the layer of {pool} is gone"
            raise RuntimeFailure(msg)
        if new.exists():
            msg = f"{name} has a layer of its own"
            raise Conflict(msg)
        os.rename(old, new)

    def reown(self, name: str, *, old_base: int, new_base: int) -> None:
        """Move the owners of a mounted layer's files from id range ``old_base`` into
        ``new_base`` (a sandbox resumed into a warm pod takes the pod's ids). Ids outside the
        old range are left alone, so a repeat after a crash finishes the job."""
        mnt = self.folder(name) / "mnt"

        def moved(value: int) -> int:
            inside = old_base <= value < old_base + IDS_PER_SANDBOX
            return value - old_base + new_base if inside else value

        with beneath.Dir.open(mnt) as root:
            beneath.chown_tree(root, lambda st: (moved(st.st_uid), moved(st.st_gid)))

    def names(self) -> set[str]:
        try:
            return {e.name for e in os.scandir(self.root) if is_workload_name(e.name)}
        except FileNotFoundError:
            return set()

    def _locked(self, folder: Path) -> contextlib.AbstractContextManager[None]:
        return beneath.flocked(folder / "lock")


def _remove_tree(path: Path) -> None:
    """``rmtree``, again while something is left: another deleter whose open of the folder's
    lock was under way at the rename creates that file anew inside the moved folder (CI: a
    ``.deleted-…`` folder left with it)."""
    for _ in range(50):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
        time.sleep(0.01)


def id_shift(delta: int, *, base: int) -> Callable[[int], int]:
    """Add ``delta`` to an id; one that would leave ``base``'s range becomes ``base`` (the
    sandbox's root)."""

    def shifted(value: int) -> int:
        new = value + delta
        return new if base <= new < base + IDS_PER_SANDBOX else base

    return shifted


def shift_ids(root: Path, delta: int, *, base: int) -> None:
    """Shift the owner and group of everything under ``root`` (``root`` included) by
    ``delta`` (see :func:`id_shift`): a descriptor walk beneath ``root``, each entry once,
    never through a symlink."""
    shifted = id_shift(delta, base=base)
    with beneath.Dir.open(root) as folder:
        beneath.chown_tree(folder, lambda st: (shifted(st.st_uid), shifted(st.st_gid)))


def copy_tree(source: Path, dest: Path, *, ids: Callable[[int], int], what: str) -> None:
    """``cp -a source/. dest`` beneath both roots (``beneath.copy_tree``): files, modes, xattrs,
    times, hard links, symlinks as links, whiteouts; owners through ``ids``. A tree a sandbox
    changes meanwhile cannot lead the copy out of either root."""
    try:
        with beneath.Dir.open(source) as src, beneath.Dir.open(dest) as dst:
            beneath.copy_tree(src, dst, beneath.CopyRules(ids=ids))
    except OSError as e:
        msg = f"{what}: {e.strerror} ({str(e.filename)[:120]})"
        raise RuntimeFailure(msg) from e


def _mount_image(image: Path, mnt: Path, *, size: int, base: int) -> None:
    """Mount the layer's ext4 image on ``mnt``, making it (sparse, ``size`` bytes) first."""
    if not image.exists():
        partial = image.with_suffix(".partial")
        with open(partial, "wb") as f:
            f.truncate(size)
        _run(
            [
                "mkfs.ext4",
                "-q",
                "-F",
                "-m",
                "0",
                "-E",
                f"lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner={base}:{base}",
                str(partial),
            ],
            "cannot create the sandbox's disk image",
        )
        os.rename(partial, image)
    _run(
        ["mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", str(image), str(mnt)],
        "cannot mount the sandbox's disk image",
    )


def _run(argv: list[str], what: str) -> None:
    result = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    if result.returncode != 0:
        reason = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        msg = f"{what}: {reason[0][:300]}"
        raise RuntimeFailure(msg)
