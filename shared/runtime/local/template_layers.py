"""The read-only layers of templates users build (local runtime), one folder per content key::

    <data dir>/template-layers/<key>/tree/    the files the step added or changed, with the
                                              sandbox's own ids (0 = its root, 1000 = `user`)
                                              and overlayfs whiteouts for what it deleted

A key is the sha256 of the step's whole history (base, every step before it, its own args and
copied files' hash), so a rebuild that changes one step finds every earlier layer under its key.
A layer appears under its key only complete (built aside, then renamed); it is never changed or
removed while a sandbox may use it (a pod mounts it, id-mapped, as an overlay lower layer:
``pod_dirs.mount_root``).

COPY steps never run a pod: the uploaded archive is unpacked here (no absolute paths, no ``..``,
no links out of the archive, no device files, no setuid bits: tarfile's ``data`` filter) into a
new layer, owned by the step's user.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import re
import shutil
import stat
import tarfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath

from shared.errors import RuntimeFailure
from shared.models.template_records import TEMPLATE_LAYERS_DIR

_KEY_RE = re.compile(r"^[a-f0-9]{64}$")
USER_IDS = {"root": 0, "user": 1000}
MAX_ARCHIVE_MEMBERS = 100_000
LOCK_FILE = ".builds.lock"


def root(data_dir: Path) -> Path:
    return data_dir / TEMPLATE_LAYERS_DIR


def tree(data_dir: Path, key: str) -> Path:
    if not _KEY_RE.match(key):
        msg = f"invalid template layer key {key[:80]!r}"
        raise RuntimeFailure(msg)
    return root(data_dir) / key / "tree"


def exists(data_dir: Path, key: str) -> bool:
    return tree(data_dir, key).is_dir()


def staging(data_dir: Path) -> Path:
    """A new, empty folder to build a layer in (``commit`` moves it under its key)."""
    folder = root(data_dir) / f".staging-{uuid.uuid4().hex}"
    (folder / "tree").mkdir(parents=True, mode=0o755)
    return folder


def commit(data_dir: Path, folder: Path, key: str) -> None:
    """Publish a built layer under ``key`` (a concurrent build of the same key wins: its layer
    is identical by construction, this one is dropped)."""
    final = tree(data_dir, key).parent
    try:
        os.rename(folder, final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(folder, ignore_errors=True)


def discard(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def is_key(name: str) -> bool:
    return _KEY_RE.match(name) is not None


def touch(data_dir: Path, key: str) -> None:
    """A build reused the layer: its time is now (unreferenced layers are a cache whose
    entries unused for longest go first)."""
    with contextlib.suppress(OSError):
        os.utime(tree(data_dir, key).parent)


def remove(data_dir: Path, name: str) -> None:
    """Remove a layer (or a leftover folder) of the layers folder: renamed away first, so a
    half-removed layer is never seen under its key."""
    folder = root(data_dir) / name
    trash = root(data_dir) / f".trash-{uuid.uuid4().hex}"
    try:
        os.rename(folder, trash)
    except FileNotFoundError:
        return
    if trash.is_symlink() or not trash.is_dir():  # never followed: only the link goes
        trash.unlink(missing_ok=True)
        return
    shutil.rmtree(trash, ignore_errors=True)


def size(folder: Path) -> int:
    """Bytes of the files under ``folder`` (not following links)."""
    total = 0
    for parent, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(parent, name)).st_size
    return total


@contextlib.contextmanager
def in_use_by_a_build(data_dir: Path) -> Iterator[None]:
    """Held (shared) for a whole build: the garbage collection sweeps only when no build runs,
    so it never takes a layer a build is about to reuse, or the staging folder of one."""
    with _lock(data_dir, fcntl.LOCK_SH) as held:
        assert held
        yield


@contextlib.contextmanager
def sweeping(data_dir: Path) -> Iterator[bool]:
    """The exclusive hold of the garbage collection: False (nothing held) while a build runs."""
    with _lock(data_dir, fcntl.LOCK_EX | fcntl.LOCK_NB) as held:
        yield held


@contextlib.contextmanager
def _lock(data_dir: Path, how: int) -> Iterator[bool]:
    root(data_dir).mkdir(parents=True, exist_ok=True, mode=0o755)
    fd = os.open(root(data_dir) / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, how)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing releases the lock


def _member_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """tarfile's ``data`` filter, except that a symlink may point anywhere (it is a name inside
    the sandbox, as in E2B; nothing here follows it: a member written through it is refused
    by the same filter, which resolves the path it would land on)."""
    if member.issym():
        return tarfile.tar_filter(member, dest)
    return tarfile.data_filter(member, dest)


def _lookup(path: PurePosixPath, lowers: Sequence[Path]) -> os.stat_result | None:
    """``path`` (absolute, inside the sandbox) in the stack of lower trees, top first."""
    relative = str(path).lstrip("/")
    for lower in lowers:
        with contextlib.suppress(OSError):
            return os.lstat(lower / relative)
    return None


def make_parents(
    layer_tree: Path, path: PurePosixPath, lowers: Sequence[Path], *, owner: int
) -> None:
    """Create ``path``'s folders in the layer; one that exists below keeps its owner and mode
    there (overlayfs shows the upper folder's attributes: a ``/home/user`` made here as root's
    would lock `user` out of their home)."""
    current = PurePosixPath("/")
    for part in path.parts[1:]:
        current = current / part
        target = layer_tree / str(current).lstrip("/")
        if target.is_dir() and not target.is_symlink():
            continue
        below = _lookup(current, lowers)
        if below is not None and not stat.S_ISDIR(below.st_mode):
            msg = f"{current} is not a folder in the template"
            raise RuntimeFailure(msg)
        target.mkdir(mode=0o755)
        if below is not None:
            os.chmod(target, stat.S_IMODE(below.st_mode))
            os.chown(target, below.st_uid, below.st_gid, follow_symlinks=False)
        else:
            os.chown(target, owner, owner, follow_symlinks=False)


def copy_in(
    archive: Path,
    layer_tree: Path,
    *,
    src: str,
    dest: str,
    workdir: str,
    owner: int,
    mode: int | None,
    lowers: Sequence[Path],
    scratch: Path,
) -> int:
    """E2B's COPY: unpack ``archive`` (the build context the SDK uploaded) in ``scratch``, then
    copy what ``src`` (a path or glob, relative to the context) matches to ``dest`` (relative
    to ``workdir``) in the layer; the number of files copied. Docker's rules: a folder copies
    its contents; a single file to a ``dest`` not ending in ``/`` is that file's new name."""
    context = scratch / "context"
    context.mkdir(mode=0o700)
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        if len(members) > MAX_ARCHIVE_MEMBERS:
            msg = f"the archive has more than {MAX_ARCHIVE_MEMBERS} entries"
            raise RuntimeFailure(msg)
        try:
            tar.extractall(context, filter=_member_filter)  # noqa: S202 - filtered: see _member_filter
        except (tarfile.TarError, OSError) as e:
            msg = f"cannot unpack the copied files: {e}"
            raise RuntimeFailure(msg) from e
    if PurePosixPath(src).is_absolute() or ".." in PurePosixPath(src).parts:
        msg = f"COPY source {src!r} must be relative to the build context"
        raise RuntimeFailure(msg)
    matches = sorted(glob.glob(src, root_dir=context, recursive=False, include_hidden=True))
    inside = os.path.realpath(context)
    for match in matches:
        # Through a symlink of the archive a glob could reach the host's files: never.
        parent = os.path.realpath(os.path.dirname(context / match))
        if parent != inside and not parent.startswith(inside + os.sep):
            msg = f"COPY source {src!r} leads out of the build context"
            raise RuntimeFailure(msg)
    if not matches:
        msg = f"COPY source {src!r} matched no file"
        raise RuntimeFailure(msg)
    target = PurePosixPath(workdir) / dest
    if ".." in target.parts:
        msg = f"COPY destination {dest!r} may not contain '..'"
        raise RuntimeFailure(msg)
    single_file = len(matches) == 1 and (context / matches[0]).is_file()
    into_folder = dest.endswith("/") or not single_file
    folder = target if into_folder else target.parent
    make_parents(layer_tree, folder, lowers, owner=owner)
    copied = 0
    for match in matches:
        source = context / match
        if source.is_dir() and not source.is_symlink():
            copied += _copy_tree(source, layer_tree, folder, owner=owner, mode=mode)
        else:
            name = PurePosixPath(match).name if into_folder else target.name
            copied += _copy_one(source, layer_tree / str(folder / name).lstrip("/"), owner, mode)
    return copied


def _copy_tree(
    source: Path, layer_tree: Path, folder: PurePosixPath, *, owner: int, mode: int | None
) -> int:
    copied = 0
    base = layer_tree / str(folder).lstrip("/")
    for current, dirs, files in os.walk(source, followlinks=False):
        rel = Path(current).relative_to(source)
        for d in dirs:
            path = base / rel / d
            if (Path(current) / d).is_symlink():
                copied += _copy_one(Path(current) / d, path, owner, mode)
                continue
            path.mkdir(mode=0o755, exist_ok=True)
            os.chown(path, owner, owner, follow_symlinks=False)
        for f in files:
            copied += _copy_one(Path(current) / f, base / rel / f, owner, mode)
    return copied


def _copy_one(source: Path, target: Path, owner: int, mode: int | None) -> int:
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    with contextlib.suppress(FileNotFoundError):
        target.unlink()
    if source.is_symlink():
        os.symlink(os.readlink(source), target)
    else:
        shutil.copy2(source, target, follow_symlinks=False)
        if mode is not None:
            os.chmod(target, mode)
    os.chown(target, owner, owner, follow_symlinks=False)
    return 1
