"""The read-only layers of templates users build (local runtime), one folder per content key::

    <data dir>/template-layers/<key>/tree/    the files the step added or changed, owned by
                                              the layer range (sandbox id X is stored as
                                              ``layer_ids.LAYER_BASE + X``), and overlayfs
                                              whiteouts for what it deleted
    <data dir>/template-layers/<key>/ids      the mark of a layer stored so (.layer_ids)

A layer is built (in ``staging``) with the sandbox's own ids (0 = its root, 1000 = `user`) and
shifted into the layer range when it is committed.

A key is the sha256 of the step's whole history (base, every step before it, its own args and
copied files' hash), so a rebuild that changes one step finds every earlier layer under its key.
A layer appears under its key only complete (built aside, then renamed); it is never changed or
removed while a sandbox may use it (a pod mounts it, id-mapped, as an overlay lower layer:
``pod_dirs.mount_root``).

COPY steps never run a pod: the uploaded archive is unpacked here and copied into a new layer,
owned by the step's user, every member checked by :func:`unpack` (not by tarfile's filters) and
every file operation beneath the context or the layer (``beneath``: no symlink is followed, so
nothing a tenant's archive holds leads a write, a chown or a removal out of them).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import fnmatch
import glob
import os
import re
import shutil
import stat
import tarfile
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from shared.errors import RuntimeFailure
from shared.models.template_records import TEMPLATE_LAYERS_DIR
from shared.runtime.local import beneath, cached_layers, layer_ids

_KEY_RE = re.compile(r"^[a-f0-9]{64}$")
USER_IDS = {"root": 0, "user": 1000}
MAX_ARCHIVE_MEMBERS = 100_000
MAX_CONTEXT_BYTES = 8 * 2**30  # unpacked: the upload's own cap bounds it compressed only
MAX_MEMBER_PATH_BYTES = 1024
LOCK_FILE = ".builds.lock"


def root(data_dir: Path) -> Path:
    return data_dir / TEMPLATE_LAYERS_DIR


def tree(data_dir: Path, key: str) -> Path:
    if cached_layers.is_cached(key):  # a packaged template's layer built by a setup script
        return cached_layers.tree(key)
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
    layer_ids.store(folder)  # owners into the layer range: no host user owns a layer's file
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


@dataclass(frozen=True)
class ContextLimits:
    """Bounds of an unpacked build context (a tar bomb stops at the first one it passes)."""

    members: int = MAX_ARCHIVE_MEMBERS
    total_bytes: int = MAX_CONTEXT_BYTES
    path_bytes: int = MAX_MEMBER_PATH_BYTES


def _member_name(name: str, limits: ContextLimits) -> PurePosixPath:
    """A member's name as a path beneath the context, or RuntimeFailure: never absolute, no
    ``..``, no control byte, bounded (tarfile's own filters are not relied on: CVE-2025-4517)."""
    shown = name[:80]
    if len(name.encode("utf-8", "surrogateescape")) > limits.path_bytes:
        raise RuntimeFailure(
            f"the archive entry {shown!r}... is longer than {limits.path_bytes} bytes"
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise RuntimeFailure(f"the archive entry {shown!r} has a control character in its name")
    if name.startswith("/"):
        raise RuntimeFailure(f"the archive entry {shown!r} is an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise RuntimeFailure(f"the archive entry {shown!r} leads out of the context ('..')")
    if any(len(p.encode("utf-8", "surrogateescape")) > 255 for p in parts):
        raise RuntimeFailure(f"the archive entry {shown!r} has a name longer than 255 bytes")
    return PurePosixPath(*parts) if parts else PurePosixPath()


def unpack(archive: Path, context: beneath.Dir, limits: ContextLimits | None = None) -> int:
    """Unpack the build context ``archive`` into the empty folder ``context``, every member
    checked here and written beneath it; the number of members. Refused: absolute names,
    ``..``, names too long, hard links to anything but a regular file unpacked before, devices,
    FIFOs, more members or bytes than ``limits``. Symlinks are made as links (their text is a
    name inside the sandbox, never followed here: a later member through one fails); setuid,
    setgid and sticky bits are dropped."""
    limits = limits or ContextLimits()
    count = 0
    total = 0
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                count += 1
                if count > limits.members:
                    raise RuntimeFailure(f"the archive has more than {limits.members} entries")
                total += max(member.size, 0)
                if total > limits.total_bytes:
                    raise RuntimeFailure(f"the archive holds more than {limits.total_bytes} bytes")
                _unpack_member(tar, member, context, limits)
    except (tarfile.TarError, EOFError) as e:
        raise RuntimeFailure(f"cannot unpack the copied files: {e}") from e
    except OSError as e:
        raise RuntimeFailure(
            f"cannot unpack the copied files: {e.strerror} ({e.filename!s:.80})"
        ) from e
    return count


def _unpack_member(
    tar: tarfile.TarFile, member: tarfile.TarInfo, context: beneath.Dir, limits: ContextLimits
) -> None:
    path = _member_name(member.name, limits)
    shown = member.name[:80]
    if not path.parts:
        return  # the context folder itself
    mode = member.mode & 0o777
    if path.parent.parts:
        context.makedirs(path.parent, 0o755)
    if member.isdir():
        existing = context.lookup(path)
        if existing is not None and not stat.S_ISDIR(existing.st_mode):
            context.remove(path)
            existing = None
        if existing is None:
            context.mkdir(path, 0o700)
        context.chmod(path, mode | 0o700)
        return
    if member.issym():
        context.remove(path)
        context.symlink(member.linkname, path)
        return
    if member.islnk():
        target = _member_name(member.linkname, limits)
        st = context.lookup(target) if target.parts else None
        if st is None or not stat.S_ISREG(st.st_mode):
            raise RuntimeFailure(f"the archive entry {shown!r} links to no file of the archive")
        context.remove(path)
        context.link(target, path)
        return
    if not member.isreg():
        raise RuntimeFailure(f"the archive entry {shown!r} is not a file, folder or link")
    context.remove(path)
    data = tar.extractfile(member)
    fd = context.open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        if data is not None:
            shutil.copyfileobj(data, out, 1 << 20)
        os.fchmod(out.fileno(), mode)


def _lookup(path: PurePosixPath, lowers: Sequence[Path]) -> tuple[os.stat_result, int] | None:
    """``path`` (absolute, inside the sandbox) in the stack of lower trees, top first (resolved
    beneath each tree: a symlink on the way is no folder, never followed), and what to subtract
    from its owner to get the sandbox's id (.layer_ids.offset)."""
    rel = PurePosixPath(str(path).lstrip("/") or ".")
    for lower in lowers:
        try:
            with beneath.Dir.open(lower) as tree_dir:
                st = tree_dir.lstat(rel)
        except OSError as e:
            if e.errno == errno.ELOOP:
                msg = f"{path} passes through a symlink in the template"
                raise RuntimeFailure(msg) from e
            continue
        return st, layer_ids.offset(lower)
    return None


def make_parents(
    layer_tree: Path, path: PurePosixPath, lowers: Sequence[Path], *, owner: int
) -> None:
    """Create ``path``'s folders in the layer; one that exists below keeps its owner and mode
    there (overlayfs shows the upper folder's attributes: a ``/home/user`` made here as root's
    would lock `user` out of their home). A symlink on the way, in the layer or below, is
    refused: nothing a COPY writes goes through a link."""
    with beneath.Dir.open(layer_tree) as tree_dir:
        _make_parents(tree_dir, path, lowers, owner=owner)


def _make_parents(
    tree_dir: beneath.Dir, path: PurePosixPath, lowers: Sequence[Path], *, owner: int
) -> None:
    current = PurePosixPath("/")
    for part in path.parts[1:]:
        current = current / part
        rel = PurePosixPath(str(current).lstrip("/"))
        here = tree_dir.lookup(rel)
        if here is not None and stat.S_ISDIR(here.st_mode):
            continue
        if here is not None:
            msg = f"{current} is not a folder in the template"
            raise RuntimeFailure(msg)
        found = _lookup(current, lowers)
        if found is not None and not stat.S_ISDIR(found[0].st_mode):
            msg = f"{current} is not a folder in the template"
            raise RuntimeFailure(msg)
        tree_dir.mkdir(rel, 0o755)
        if found is not None:
            below, shift = found
            tree_dir.chmod(rel, stat.S_IMODE(below.st_mode))
            tree_dir.chown(rel, below.st_uid - shift, below.st_gid - shift)
        else:
            tree_dir.chown(rel, owner, owner)


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
    limits: ContextLimits | None = None,
) -> int:
    """E2B's COPY: unpack ``archive`` (the build context the SDK uploaded) in ``scratch``, then
    copy what ``src`` (a path or glob, relative to the context) matches to ``dest`` (relative
    to ``workdir``) in the layer; the number of files copied. Docker's rules: a folder copies
    its contents; a single file to a ``dest`` not ending in ``/`` is that file's new name.

    Everything is done beneath the context and the layer (``beneath``): a glob never descends
    through a symlink of the context, and an entry already in the layer (made by an earlier
    match) is replaced, never written through."""
    source = PurePosixPath(src)
    if "\x00" in src or source.is_absolute() or ".." in source.parts:
        msg = f"COPY source {src[:80]!r} must be relative to the build context"
        raise RuntimeFailure(msg)
    target = PurePosixPath(workdir) / dest
    if ".." in target.parts or "\x00" in dest:
        msg = f"COPY destination {dest[:80]!r} may not contain '..'"
        raise RuntimeFailure(msg)
    folder_path = scratch / "context"
    folder_path.mkdir(mode=0o700)
    with beneath.Dir.open(folder_path) as context, beneath.Dir.open(layer_tree) as tree_dir:
        unpack(archive, context, limits)
        matches = _glob(context, source)
        if not matches:
            msg = f"COPY source {src[:80]!r} matched no file"
            raise RuntimeFailure(msg)
        first = context.lstat(matches[0])
        single_file = len(matches) == 1 and stat.S_ISREG(first.st_mode)
        into_folder = dest.endswith("/") or not single_file
        folder = target if into_folder else target.parent
        _make_parents(tree_dir, folder, lowers, owner=owner)
        rules = beneath.CopyRules(
            ids=lambda _: owner,
            file_mode=mode,
            strip_setid=True,
            special="refuse",
            merge=True,
            root_meta=False,
            xattrs=False,
        )
        layer_folder = PurePosixPath(str(folder).lstrip("/") or ".")
        copied = 0
        try:
            for match in matches:
                st = context.lstat(match)
                with tree_dir.dir(layer_folder) as into:
                    if stat.S_ISDIR(st.st_mode):
                        with context.dir(match) as tree_source:
                            copied += beneath.copy_tree(tree_source, into, rules)
                    else:
                        name = match.name if into_folder else target.name
                        copied += _copy_entry(context, match, into, name, rules)
        except OSError as e:
            msg = f"cannot copy {src[:80]!r}: {e.strerror} ({e.filename!s:.80})"
            raise RuntimeFailure(msg) from e
    return copied


def _copy_entry(
    context: beneath.Dir,
    match: PurePosixPath,
    into: beneath.Dir,
    name: str,
    rules: beneath.CopyRules,
) -> int:
    """One matched non-folder (a file or a symlink) as ``name`` in the folder ``into``: copied
    through a one-entry tree so the same code (and the same rules) write it."""
    with context.dir(match.parent if match.parent.parts else ".") as parent:
        return beneath.copy_one(parent, match.name, into, name, rules)


def _glob(context: beneath.Dir, pattern: PurePosixPath) -> list[PurePosixPath]:
    """What ``pattern`` (relative; ``*``, ``?``, ``[...]`` in any part; hidden names included)
    matches in the context, sorted; every folder on the way is a real folder (a symlink of the
    context is matched as itself, never entered)."""
    found = [PurePosixPath()]
    parts = [p for p in pattern.parts if p != "."]
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        step: list[PurePosixPath] = []
        for base in found:
            st = context.lookup(base) if base.parts else None
            if base.parts and (st is None or not stat.S_ISDIR(st.st_mode)):
                continue
            if glob.has_magic(part):
                names = [
                    n
                    for n in context.scandir(base if base.parts else ".")
                    if fnmatch.fnmatchcase(n, part)
                ]
            else:
                names = [part] if context.lookup(base / part) is not None else []
            step.extend(base / n for n in names)
        found = step
        if not last:
            found = [p for p in found if _is_folder(context, p)]
    return sorted(p for p in found if p.parts) if parts else [PurePosixPath()]


def _is_folder(context: beneath.Dir, path: PurePosixPath) -> bool:
    st = context.lookup(path)
    return st is not None and stat.S_ISDIR(st.st_mode)
