"""File operations beneath a root directory: the one place where the host, as root, touches a
tree whose names a tenant chose (a build context, a template layer, a sandbox's kept layer or
volume, a snapshot's files).

Every operation names a path *relative to an open directory* (:class:`Dir`) and the kernel
resolves it with ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
RESOLVE_NO_XDEV)``: no ``..`` out, no symlink followed anywhere on the way (a symlink is an
error, ``ELOOP``), no ``/proc`` magic link, no mount crossed. The last component is then acted on
through its parent's descriptor with the ``*at`` calls and ``AT_SYMLINK_NOFOLLOW``, so a
symlink is created, chowned, removed as a link and never followed. Nothing here resolves a
path string from the host's root; a directory swapped for a symlink while a walk runs makes
the walk fail (``ELOOP``), never leave the tree.

:func:`copy_tree` copies one such tree into another (files, modes, owners through an id map,
xattrs, times, hard links, symlinks as links, overlayfs whiteouts); :func:`chown_tree` moves a
tree's owners. Both walk with descriptors and a stack (no recursion limit, no fd per level).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

_SYS_OPENAT2 = 437  # the same number on x86_64 and on the generic table (arm64)
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
STRICT = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV
# What a tree a running sandbox changes under a walk may answer: the entry is skipped.
_CHANGED = (errno.ELOOP, errno.ENOENT, errno.ENOTDIR)
_CHUNK = 1 << 20

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


def openat2(dirfd: int, path: str, flags: int, mode: int = 0, resolve: int = STRICT) -> int:
    """``openat2(2)``: a new descriptor (close-on-exec) for ``path`` resolved beneath ``dirfd``."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    raw = os.fsencode(path)
    for _ in range(16):  # EAGAIN: a concurrent rename elsewhere in the tree; try again
        fd = _syscall(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_int(dirfd),
            ctypes.c_char_p(raw),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            raise OSError(err, os.strerror(err), path)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)


def relative(path: str | PurePosixPath) -> PurePosixPath:
    """``path`` as a relative path beneath a root: never absolute, no ``..``, no NUL."""
    text = str(path)
    if "\x00" in text:
        raise OSError(errno.EINVAL, "a path may not contain NUL", text[:200])
    pure = PurePosixPath(text)
    if pure.is_absolute() or ".." in pure.parts:
        raise OSError(errno.EXDEV, "a path must stay beneath its root", text[:200])
    return pure


def _name_of(pure: PurePosixPath) -> tuple[str, str]:
    if not pure.parts:
        raise OSError(errno.EINVAL, "the root itself has no parent", ".")
    return str(pure.parent), pure.name


class Dir:
    """An open directory; every path given to it is resolved beneath it (see the module)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def open(cls, path: Path | str) -> Dir:
        """The root: a path the host chose (never a tenant), not itself a symlink."""
        return cls(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Dir:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- resolving ---------------------------------------------------------------------------

    def dir(self, path: str | PurePosixPath) -> Dir:
        """The directory ``path`` beneath this one, open (the caller closes it)."""
        pure = relative(path)
        if not pure.parts:
            return Dir(os.dup(self.fd))
        return Dir(openat2(self.fd, str(pure), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW))

    @contextlib.contextmanager
    def at(self, path: str | PurePosixPath) -> Iterator[tuple[int, str]]:
        """``path``'s parent directory (a descriptor, resolved beneath) and its last name."""
        parent, name = _name_of(relative(path))
        if parent == ".":
            yield self.fd, name
            return
        fd = openat2(self.fd, parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            yield fd, name
        finally:
            os.close(fd)

    def open_file(self, path: str | PurePosixPath, flags: int, mode: int = 0o600) -> int:
        """A descriptor of ``path`` (never through a symlink, the last name included)."""
        creating = flags & (os.O_CREAT | os.O_TMPFILE) != 0
        return openat2(self.fd, str(relative(path)), flags | os.O_NOFOLLOW, mode if creating else 0)

    # ---- one entry ---------------------------------------------------------------------------

    def lstat(self, path: str | PurePosixPath) -> os.stat_result:
        pure = relative(path)
        if not pure.parts:
            return os.fstat(self.fd)
        with self.at(pure) as (fd, name):
            return os.stat(name, dir_fd=fd, follow_symlinks=False)

    def lookup(self, path: str | PurePosixPath) -> os.stat_result | None:
        """``lstat``, or None when ``path`` (or a folder on its way) does not exist."""
        try:
            return self.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def mkdir(self, path: str | PurePosixPath, mode: int = 0o755) -> None:
        with self.at(path) as (fd, name):
            os.mkdir(name, mode, dir_fd=fd)

    def makedirs(self, path: str | PurePosixPath, mode: int = 0o755) -> list[PurePosixPath]:
        """Make the folders of ``path`` that are missing; the ones made, top first. A name on
        the way that exists and is not a folder (a symlink included) is an error."""
        made: list[PurePosixPath] = []
        current = PurePosixPath()
        for part in relative(path).parts:
            current = current / part
            st = self.lookup(current)
            if st is None:
                self.mkdir(current, mode)
                made.append(current)
            elif not stat.S_ISDIR(st.st_mode):
                raise OSError(
                    errno.ENOTDIR, "not a folder (a symlink is never followed)", str(current)
                )
        return made

    def symlink(self, target: str, path: str | PurePosixPath) -> None:
        """A symlink at ``path`` whose text is ``target`` (never resolved here)."""
        with self.at(path) as (fd, name):
            os.symlink(target, name, dir_fd=fd)

    def readlink(self, path: str | PurePosixPath) -> str:
        with self.at(path) as (fd, name):
            return os.readlink(name, dir_fd=fd)

    def link(self, existing: str | PurePosixPath, path: str | PurePosixPath) -> None:
        """A hard link at ``path`` to the entry ``existing`` (both beneath; never followed)."""
        with self.at(existing) as (src_fd, src_name), self.at(path) as (dst_fd, dst_name):
            os.link(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd, follow_symlinks=False)

    def chown(self, path: str | PurePosixPath, uid: int, gid: int) -> None:
        pure = relative(path)
        if not pure.parts:
            os.fchown(self.fd, uid, gid)
            return
        with self.at(pure) as (fd, name):
            os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)

    def chmod(self, path: str | PurePosixPath, mode: int) -> None:
        """A file's or a folder's mode (a symlink has none: left alone)."""
        fd = openat2(self.fd, str(relative(path)) or ".", os.O_PATH | os.O_NOFOLLOW)
        try:
            if not stat.S_ISLNK(os.fstat(fd).st_mode):
                _fchmod_path_fd(fd, mode)
        finally:
            os.close(fd)

    def unlink(self, path: str | PurePosixPath) -> None:
        with self.at(path) as (fd, name):
            os.unlink(name, dir_fd=fd)

    def remove(self, path: str | PurePosixPath) -> None:
        """Remove ``path`` whatever it is: a folder with its contents (rmtree's descriptor walk,
        which never follows a symlink), anything else as itself. Missing: nothing to do."""
        with self.at(path) as (fd, name):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)

    def scandir(self, path: str | PurePosixPath = ".") -> list[str]:
        """The names in folder ``path``."""
        with self.dir(path) as d:
            return sorted(os.listdir(d.fd))


def _fchmod_path_fd(fd: int, mode: int) -> None:
    # fchmod(2) refuses an O_PATH descriptor; its /proc/self/fd entry is that very inode.
    os.chmod(f"/proc/self/fd/{fd}", mode)


def identity(value: int) -> int:
    return value


Special = Literal["whiteouts", "refuse"]


@dataclass
class CopyRules:
    """What :func:`copy_tree` does with what it copies.

    ``ids`` maps each owner and group id; ``file_mode`` replaces regular files' modes;
    ``strip_setid`` drops setuid/setgid bits; ``special``: ``"whiteouts"`` copies overlayfs
    whiteouts (0/0 character devices), FIFOs and sockets, ``"refuse"`` makes any of them an
    error; ``merge``: an existing destination entry is replaced (a folder meeting a folder is
    kept and filled), else an existing entry is an error; ``root_meta``: the destination root
    takes the source root's owner, mode and xattrs; ``xattrs``/``times``: copied too."""

    ids: Callable[[int], int] = identity
    file_mode: int | None = None
    strip_setid: bool = False
    special: Special = "whiteouts"
    merge: bool = False
    root_meta: bool = True
    xattrs: bool = True
    times: bool = True
    folder_owner: Callable[[os.stat_result], tuple[int, int] | None] | None = None


@dataclass
class _Walk:
    rules: CopyRules
    dest: Dir
    copied: int = 0
    links: dict[tuple[int, int], PurePosixPath] = field(default_factory=dict)
    folders: list[tuple[PurePosixPath, os.stat_result]] = field(default_factory=list)


def copy_tree(source: Dir, dest: Dir, rules: CopyRules | None = None) -> int:
    """Copy the contents of ``source`` into the folder ``dest``; the number of entries copied
    (folders not counted).
    Both are walked with descriptors, beneath their roots: a source entry that is swapped while
    the copy runs is either copied as what it became (a symlink as a link) or fails the copy
    (``ELOOP``), and nothing outside ``dest`` is written."""
    walk = _Walk(rules or CopyRules(), dest)
    root = PurePosixPath()
    if walk.rules.root_meta:
        st = os.fstat(source.fd)
        _meta_fd(source.fd, dest.fd, st, walk.rules)
        walk.folders.append((root, st))
    stack = [root]
    while stack:
        rel = stack.pop()
        try:
            src = source.dir(rel)
        except OSError as e:
            if e.errno in _CHANGED:
                continue  # swapped or removed since it was listed (a running sandbox's tree)
            raise
        with src, dest.dir(rel) as dst:
            for name in sorted(os.listdir(src.fd)):
                child = _copy_entry(src, dst, name, rel / name, walk)
                if child is not None:
                    stack.append(child)
    for rel, st in reversed(walk.folders):  # modes and times last: writes inside changed them
        with dest.dir(rel) as d:
            _fchmod_path_fd(d.fd, _mode(st.st_mode, walk.rules))
            if walk.rules.times:
                os.utime(d.fd, ns=(st.st_atime_ns, st.st_mtime_ns))
    return walk.copied


def _mode(st_mode: int, rules: CopyRules) -> int:
    mode = stat.S_IMODE(st_mode)
    return mode & ~(stat.S_ISUID | stat.S_ISGID) if rules.strip_setid else mode


def _ids(st: os.stat_result, rules: CopyRules) -> tuple[int, int]:
    return rules.ids(st.st_uid), rules.ids(st.st_gid)


def _copy_xattrs(src_fd: int, dst_fd: int) -> None:
    try:
        names = os.listxattr(src_fd)
    except OSError:
        return
    for name in names:
        with contextlib.suppress(OSError):  # as cp -a: an attribute the target refuses is lost
            os.setxattr(dst_fd, name, os.getxattr(src_fd, name))


def _meta_fd(src_fd: int, dst_fd: int, st: os.stat_result, rules: CopyRules) -> None:
    """Owner and xattrs of a folder (its mode and times come after its contents)."""
    owner = rules.folder_owner(st) if rules.folder_owner is not None else None
    os.fchown(dst_fd, *(owner or _ids(st, rules)))
    if rules.xattrs:
        _copy_xattrs(src_fd, dst_fd)


def _clear(dst: Dir, name: str, *, keep_folder: bool, rules: CopyRules) -> bool:
    """Make room for ``name`` in ``dst``; True when a folder is there and kept."""
    try:
        st = os.stat(name, dir_fd=dst.fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if keep_folder and stat.S_ISDIR(st.st_mode):
        return True
    if not rules.merge:
        raise OSError(errno.EEXIST, "already in the destination", name)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dst.fd)
    else:
        os.unlink(name, dir_fd=dst.fd)  # a planted symlink goes as a link
    return False


def copy_one(src: Dir, name: str, dst: Dir, new_name: str, rules: CopyRules | None = None) -> int:
    """Copy the entry ``name`` of folder ``src`` (not a folder) as ``new_name`` in ``dst``."""
    walk = _Walk(rules or CopyRules(), dst)
    _copy_entry(src, dst, name, PurePosixPath(new_name), walk, new_name=new_name)
    return walk.copied


def _copy_entry(
    src: Dir,
    dst: Dir,
    name: str,
    rel: PurePosixPath,
    walk: _Walk,
    *,
    new_name: str | None = None,
) -> PurePosixPath | None:
    """Copy one entry (``new_name`` in ``dst``, by default its own); a folder's path to walk
    next, else None."""
    rules = walk.rules
    src_name, name = name, new_name or name
    try:
        st = os.stat(src_name, dir_fd=src.fd, follow_symlinks=False)
    except FileNotFoundError:
        return None  # removed meanwhile (a running sandbox)
    kind = stat.S_IFMT(st.st_mode)
    if kind == stat.S_IFDIR:
        if new_name is not None:
            raise OSError(errno.EISDIR, "a folder is copied with copy_tree", src_name)
        if not _clear(dst, name, keep_folder=True, rules=rules):
            os.mkdir(name, 0o700, dir_fd=dst.fd)
        walk.folders.append((rel, st))
        try:
            folder = src.dir(src_name)
        except OSError as e:
            if e.errno in _CHANGED:
                return None  # swapped or removed since it was listed: an empty folder
            raise
        with folder, dst.dir(name) as d:
            _meta_fd(folder.fd, d.fd, st, rules)
        return rel
    if kind == stat.S_IFREG and st.st_nlink > 1 and (st.st_dev, st.st_ino) in walk.links:
        _clear(dst, name, keep_folder=False, rules=rules)
        first = walk.links[(st.st_dev, st.st_ino)]
        with walk.dest.at(first) as (first_fd, first_name):
            os.link(first_name, name, src_dir_fd=first_fd, dst_dir_fd=dst.fd, follow_symlinks=False)
        walk.copied += 1
        return None
    if kind == stat.S_IFREG:
        _clear(dst, name, keep_folder=False, rules=rules)
        if _copy_file(src, dst, (src_name, name), st, rules) and st.st_nlink > 1:
            walk.links[(st.st_dev, st.st_ino)] = rel
        walk.copied += 1
        return None
    if kind == stat.S_IFLNK:
        try:
            target = os.readlink(src_name, dir_fd=src.fd)
        except OSError as e:
            if e.errno in (*_CHANGED, errno.EINVAL):
                return None  # no longer a link
            raise
        _clear(dst, name, keep_folder=False, rules=rules)
        os.symlink(target, name, dir_fd=dst.fd)
        os.chown(name, *_ids(st, rules), dir_fd=dst.fd, follow_symlinks=False)
        if rules.times:
            os.utime(
                name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dst.fd, follow_symlinks=False
            )
        walk.copied += 1
        return None
    whiteout = kind == stat.S_IFCHR and st.st_rdev == 0
    if rules.special == "refuse" or not (whiteout or kind in (stat.S_IFIFO, stat.S_IFSOCK)):
        raise OSError(errno.EPERM, "a device, FIFO or socket is not copied", str(rel)[:300])
    _clear(dst, name, keep_folder=False, rules=rules)
    os.mknod(name, kind | _mode(st.st_mode, rules), 0, dir_fd=dst.fd)
    os.chown(name, *_ids(st, rules), dir_fd=dst.fd, follow_symlinks=False)
    walk.copied += 1
    return None


def _copy_file(
    src: Dir, dst: Dir, names: tuple[str, str], st: os.stat_result, rules: CopyRules
) -> bool:
    """Copy one regular file (a clone where the filesystem can, holes kept); False when it is
    no regular file any more (swapped meanwhile: skipped)."""
    src_name, name = names
    try:
        in_fd = os.open(
            src_name,
            os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
            dir_fd=src.fd,
        )
    except OSError as e:
        if e.errno in _CHANGED:
            return False
        raise
    try:
        now = os.fstat(in_fd)
        if not stat.S_ISREG(now.st_mode):
            return False
        out_fd = os.open(
            name,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=dst.fd,
        )
        try:
            _copy_data(in_fd, out_fd, now)
            os.fchown(out_fd, *_ids(now, rules))
            if rules.xattrs:
                _copy_xattrs(in_fd, out_fd)
            mode = rules.file_mode if rules.file_mode is not None else now.st_mode
            os.fchmod(out_fd, _mode(mode, rules))  # after the chown, which clears setuid bits
            if rules.times:
                os.utime(out_fd, ns=(now.st_atime_ns, now.st_mtime_ns))
        finally:
            os.close(out_fd)
    finally:
        os.close(in_fd)
    return True


def _copy_data(in_fd: int, out_fd: int, st: os.stat_result) -> None:
    """The file's bytes; holes stay holes. ``copy_file_range`` clones where the filesystem can
    (btrfs, XFS), so no separate FICLONE is tried."""
    size = st.st_size
    if size == 0:
        return
    if st.st_blocks * 512 >= size:  # no holes to keep: one range
        _copy_range(in_fd, out_fd, 0, size)
        return
    offset = 0
    while offset < size:
        try:
            start = os.lseek(in_fd, offset, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # only a hole is left
                break
            raise
        end = os.lseek(in_fd, start, os.SEEK_HOLE)
        _copy_range(in_fd, out_fd, start, end)
        offset = end
    os.ftruncate(out_fd, size)  # a hole at the end


def _copy_range(in_fd: int, out_fd: int, start: int, end: int) -> None:
    """Bytes ``start..end`` of one file to the same place in another: ``copy_file_range``
    (a clone or an in-kernel copy), or read and write across filesystems (``EXDEV``)."""
    position = start
    while position < end:
        try:
            n = os.copy_file_range(
                in_fd, out_fd, min(_CHUNK * 64, end - position), position, position
            )
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            break
        if n == 0:
            return  # the file shrank meanwhile
        position += n
    while position < end:
        chunk = os.pread(in_fd, min(_CHUNK, end - position), position)
        if not chunk:
            return
        written = 0
        while written < len(chunk):
            written += os.pwrite(out_fd, chunk[written:], position + written)
        position += len(chunk)


def chown_tree(root: Dir, change: Callable[[os.stat_result], tuple[int, int] | None]) -> int:
    """Call ``change`` for every entry beneath ``root`` (``root`` included) and give the entry
    the owner it returns (None: unchanged); the number changed. A descriptor walk, never
    through a symlink (symlinks themselves are chowned as links)."""
    changed = 0
    top = change(os.fstat(root.fd))
    if top is not None:
        os.fchown(root.fd, *top)
        changed += 1
    stack = [PurePosixPath()]
    while stack:
        rel = stack.pop()
        try:
            folder = root.dir(rel)
        except FileNotFoundError:
            continue
        with folder:
            for name in os.listdir(folder.fd):
                try:
                    st = os.stat(name, dir_fd=folder.fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                wanted = change(st)
                if wanted is not None and wanted != (st.st_uid, st.st_gid):
                    os.chown(name, *wanted, dir_fd=folder.fd, follow_symlinks=False)
                    changed += 1
                if stat.S_ISDIR(st.st_mode):
                    stack.append(rel / name)
    return changed


def tree_bytes(root: Dir) -> int:
    """Disk bytes of the regular files beneath ``root`` (blocks, not lengths)."""
    total = 0
    stack = [PurePosixPath()]
    while stack:
        rel = stack.pop()
        try:
            folder = root.dir(rel)
        except OSError:
            continue
        with folder:
            for name in os.listdir(folder.fd):
                with contextlib.suppress(OSError):
                    st = os.stat(name, dir_fd=folder.fd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(rel / name)
                    elif stat.S_ISREG(st.st_mode):
                        total += st.st_blocks * 512
    return total


@contextlib.contextmanager
def flocked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the lock file ``path`` (made 0600 if absent, never
    through a symlink) for the block."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
