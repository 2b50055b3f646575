"""The mount system calls the pod's root filesystem needs, through libc (no helper binaries).

- :func:`idmapped_clone`: a read-only, idmapped copy of the shared rootfs (``open_tree`` +
  ``mount_setattr(MOUNT_ATTR_IDMAP)`` + ``move_mount``, Linux 5.12+), so files that host root
  owns appear as owned by the pod's root (host uid ``base``) and uid 1000 as ``base+1000``.
  Nothing on disk changes and every pod shares one copy of the rootfs.
- :func:`mount_overlay`: that clone as overlayfs' lower layer (idmapped lower layers: Linux
  5.19+) under the sandbox's writable layer.
- :func:`unmount`: lazily, so a pod's leftovers never keep a folder from being removed.

The id mapping is taken from a user namespace made only for it (:func:`mapping_userns`): the
pod's own namespace does not exist yet when its root is mounted.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import re
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from shared.errors import RuntimeFailure

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)

# x86_64 and aarch64 share these numbers (the new mount API came after the tables were unified).
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY = _MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = _MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = _MOUNT_ATTR_NODEV = 0x4
_MOUNT_ATTR_IDMAP = 0x100000
_MS_RDONLY = 0x1
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MNT_DETACH = 0x2
# Characters overlayfs' option parser would split on.
_UNSAFE_OPTION_CHARS = frozenset(",:\\\n\0")


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _fail(what: str) -> RuntimeFailure:
    err = ctypes.get_errno()
    return RuntimeFailure(f"{what}: {os.strerror(err)}")


def mapping_userns(base: int, count: int, *, inner: int = 0) -> int:
    """A descriptor of a new user namespace mapping ids ``inner..inner+count-1`` to ``base..``
    on the host (its only use: the id mapping of an idmapped mount, which shows a file stored
    with id ``inner + k`` as ``base + k``). The process that made it is gone when this returns;
    the descriptor keeps the namespace."""
    own = os.readlink("/proc/self/ns/user")
    child = subprocess.Popen(
        ["unshare", "--user", "--", "cat"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={"PATH": "/usr/bin:/bin"},
    )
    try:
        deadline = time.monotonic() + 10
        while True:  # until ``unshare`` has entered its namespace
            try:
                if os.readlink(f"/proc/{child.pid}/ns/user") != own:
                    break
            except OSError as e:
                raise RuntimeFailure(f"cannot create an id-mapping namespace ({e})") from e
            if child.poll() is not None or time.monotonic() > deadline:
                msg = "cannot create an id-mapping namespace (unshare --user failed)"
                raise RuntimeFailure(msg)
            time.sleep(0.001)
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{child.pid}/{name}", "w") as f:
                f.write(f"{inner} {base} {count}\n")
        return os.open(f"/proc/{child.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        with contextlib.suppress(OSError):
            child.kill()
        child.wait()


def idmapped_clone(source: Path, target: Path, *, userns_fd: int) -> None:
    """Mount a read-only, nosuid, nodev copy of ``source`` on ``target`` with the ids of
    ``userns_fd`` (see the module docstring)."""
    syscall = _libc.syscall
    syscall.restype = ctypes.c_long
    fd = syscall(
        _SYS_OPEN_TREE,
        _AT_FDCWD,
        str(source).encode(),
        _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC,
    )
    if fd < 0:
        raise _fail(f"cannot clone the root filesystem {source}")
    try:
        attr = _MountAttr(
            attr_set=_MOUNT_ATTR_IDMAP
            | _MOUNT_ATTR_RDONLY
            | _MOUNT_ATTR_NOSUID
            | _MOUNT_ATTR_NODEV,
            userns_fd=userns_fd,
        )
        if (
            syscall(
                _SYS_MOUNT_SETATTR,
                fd,
                b"",
                _AT_EMPTY_PATH,
                ctypes.byref(attr),
                ctypes.sizeof(attr),
            )
            != 0
        ):
            raise _fail("cannot id-map the root filesystem (needs Linux 5.12+)")
        if (
            syscall(
                _SYS_MOVE_MOUNT,
                fd,
                b"",
                _AT_FDCWD,
                str(target).encode(),
                _MOVE_MOUNT_F_EMPTY_PATH,
            )
            != 0
        ):
            raise _fail(f"cannot mount the root filesystem on {target}")
    finally:
        os.close(fd)


def set_attributes(tree_fd: int, flags: int) -> None:
    """Set ``MOUNT_ATTR_*`` ``flags`` on a detached mount tree (``open_tree``) and its children."""
    attr = _MountAttr(attr_set=flags)
    syscall = _libc.syscall
    syscall.restype = ctypes.c_long
    if (
        syscall(
            _SYS_MOUNT_SETATTR,
            tree_fd,
            b"",
            _AT_EMPTY_PATH | _AT_RECURSIVE,
            ctypes.byref(attr),
            ctypes.sizeof(attr),
        )
        != 0
    ):
        raise _fail("cannot set the attributes of a mount")


def check_option_path(path: Path) -> None:
    if _UNSAFE_OPTION_CHARS & set(str(path)):
        msg = f"{str(path)[:200]!r}: the data dir path may not contain ',', ':', '\\' or newlines"
        raise RuntimeFailure(msg)


def mount_overlay(lower: Path | Sequence[Path], upper: Path, work: Path, target: Path) -> None:
    """overlayfs on ``target``: ``lower`` read-only under ``upper`` (``work`` on upper's fs);
    several lower layers: the first is the top one. Its options name no host path (see
    :func:`_layer_names`)."""
    lowers = [lower] if isinstance(lower, Path) else list(lower)
    for path in (*lowers, upper, work, target):
        check_option_path(path)
    with _layer_names([*lowers, upper, work]) as names:
        # index/metacopy/redirect_dir off: a kept upper layer stays a plain tree of files,
        # usable with any later lower layer and readable by the snapshot code without overlayfs.
        lowerdir = ":".join(names[: len(lowers)])
        options = f"lowerdir={lowerdir},upperdir={names[-2]},workdir={names[-1]}"
        options += ",index=off,metacopy=off"
        _mount_overlay(target, options, _MS_NOSUID | _MS_NODEV, "torpor-root")


def mount_read_only(source: Path, empty: Path, target: Path) -> None:
    """A read-only overlayfs of ``source`` alone on ``target`` (``empty``: an empty folder, the
    second lower layer overlayfs needs without an upper one). Unlike a bind of ``source``,
    whose mount table entry shows ``source``'s path inside its filesystem, this is the root
    of a filesystem of its own: bound into a pod, its mount table entry names no host path."""
    for path in (source, empty, target):
        check_option_path(path)
    with _layer_names([source, empty]) as names:
        flags = _MS_RDONLY | _MS_NOSUID | _MS_NODEV
        _mount_overlay(target, f"lowerdir={names[0]}:{names[1]}", flags, "torpor-ro")


def mount_upper_over_itself(lower: Path, upper: Path, work: Path, *, name: str) -> None:
    """A read-write overlayfs on ``upper`` whose upper layer is ``upper`` itself (``lower``: an
    empty folder): what is written through it lands where it always did, and a bind of a folder
    beneath it shows that folder's path inside this filesystem (see .volume_fs)."""
    for path in (lower, upper, work):
        check_option_path(path)
    with _layer_names([lower, upper, work]) as names:
        options = f"lowerdir={names[0]},upperdir={names[1]},workdir={names[2]}"
        _mount_overlay(upper, options, _MS_NOSUID | _MS_NODEV, name)


@contextlib.contextmanager
def _layer_names(paths: Sequence[Path]) -> Iterator[list[str]]:
    """Names of ``paths`` for overlayfs' options: ``/proc/self/fd/<n>`` of a descriptor of each.
    overlayfs shows its options as they were given (``/proc/*/mountinfo``, in every pod that
    binds the mount), so a layer given by path showed the data dir's path inside the sandbox."""
    fds: list[int] = []
    try:
        for path in paths:
            fds.append(os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        yield [f"/proc/self/fd/{fd}" for fd in fds]
    finally:
        for fd in fds:
            os.close(fd)


def _mount_overlay(target: Path, options: str, flags: int, name: str) -> None:
    if _libc.mount(name.encode(), str(target).encode(), b"overlay", flags, options.encode()) != 0:
        raise _fail(f"cannot mount {target} (overlayfs)")


def mount_tmpfs(target: Path, *, size: int, owner: int, name: str = "torpor-layer") -> None:
    options = f"size={size},uid={owner},gid={owner},mode=0755".encode()
    if _libc.mount(name.encode(), str(target).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options):
        raise _fail(f"cannot mount {target} (tmpfs)")


def is_mounted(target: Path) -> bool:
    """Whether something is mounted on ``target``, from the mount table: ``os.path.ismount``
    compares devices and misses a bind (or idmapped) mount of a folder of the same filesystem."""
    try:
        path = os.path.realpath(target)
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                fields = line.split(" ", 5)
                if len(fields) > 4 and unescape(fields[4]) == path:
                    return True
    except OSError:
        return os.path.ismount(target)
    return False


def unescape(field: str) -> str:
    """mountinfo's octal escapes (space, tab, newline, backslash)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def unmount(target: Path) -> None:
    """Unmount everything mounted on ``target`` (lazily when still busy)."""
    while is_mounted(target):
        if _libc.umount2(str(target).encode(), 0) != 0 and (
            _libc.umount2(str(target).encode(), _MNT_DETACH) != 0
        ):
            if ctypes.get_errno() == errno.EINVAL and not is_mounted(target):
                return  # unmounted meanwhile by another instance on the data dir
            raise _fail(f"cannot unmount {target}")


def mounted_under(folder: Path) -> list[Path]:
    """Mount points strictly inside ``folder``, deepest first (the order to unmount them)."""
    root = os.path.realpath(folder).rstrip("/") + "/"
    found: set[str] = set()
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                fields = line.split(" ", 5)
                if len(fields) > 4 and (point := unescape(fields[4])).startswith(root):
                    found.add(point)
    except OSError:
        return []
    return [Path(p) for p in sorted(found, key=lambda p: (-p.count("/"), p))]


def unmount_under(folder: Path) -> int:
    """Unmount everything inside ``folder``; how many mount points there were. Only for what no
    process uses any more: a stopped instance's pod roots, lowers, workspaces and layers."""
    points = mounted_under(folder)
    for point in points:
        unmount(point)
    return len(points)


def private_shell(script: str, name: str) -> list[str]:
    """Argv that runs the shell ``script`` (``$0`` = ``name``, then the arguments appended) as
    root in a mount namespace of its own with private propagation: its mounts (a stage of
    binds) appear nowhere else and go with the command it execs."""
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, name]
