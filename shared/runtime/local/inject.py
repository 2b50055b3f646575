"""Changing a running pod from the host: mounts into its mount namespace, its hostname.

A warm pod (:mod:`.pools`) starts before anyone knows which sandbox it will serve, so what is
the sandbox's own is given to it at claim: its volumes are bound into the pod's mount namespace
and the pod gets the sandbox's hostname. bwrap made the pod's namespaces (owned by the pod's
user namespace); host root may enter them. A bind from the host cannot name a host path inside
the pod (the pod sees only its own tree), so each source is first cloned into a detached mount
(``open_tree(OPEN_TREE_CLONE)``, in the host's namespace), and a short-lived child process
enters the pod's namespace (``setns``) and attaches it there (``move_mount``): the new mount API
(Linux 5.2+) allows a detached mount to be attached in another namespace. The child is forked,
not exec'd: ``setns`` into a mount namespace needs a process that shares its filesystem context
with no other thread, and a fork costs less than a new interpreter. It makes only system calls.

Mounts made here are owned by the host's user namespace: the pod's root (no ``CAP_SYS_ADMIN``)
can neither unmount nor change them.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import platform
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shared.errors import RuntimeFailure
from shared.runtime.local import mounts

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)

_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_OPEN_TREE_CLONE = 1
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_MAX_HOSTNAME = 64
_SYS_PIVOT_ROOT = 41 if platform.machine() in ("aarch64", "arm64") else 155


@dataclass(frozen=True)
class Bind:
    """Bind host ``source`` (a folder) on ``target`` (an absolute path inside the pod), created
    as a folder owned by ``owner`` (a host uid: the pod's root) when missing."""

    source: Path
    target: str
    owner: int
    read_only: bool = False
    identity: str | None = None  # the folder's "dev:ino" the clone must be (see bwrap.Mount)


def _clone(source: Path, *, read_only: bool) -> int:
    syscall = _libc.syscall
    syscall.restype = ctypes.c_long
    fd = syscall(
        _SYS_OPEN_TREE,
        _AT_FDCWD,
        str(source).encode(),
        _OPEN_TREE_CLONE | os.O_CLOEXEC | _AT_RECURSIVE,
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise RuntimeFailure(f"cannot clone {source} for a pod: {os.strerror(err)}")
    flags = mounts.MOUNT_ATTR_NOSUID | mounts.MOUNT_ATTR_NODEV
    try:
        mounts.set_attributes(fd, flags | (mounts.MOUNT_ATTR_RDONLY if read_only else 0))
    except RuntimeFailure:
        os.close(fd)
        raise
    return int(fd)


def _valid_target(target: str) -> bool:
    parts = target.split("/")
    return (
        target.startswith("/")
        and "\0" not in target
        and all(p not in (".", "..") for p in parts)
        and len(target) < 4096
    )


def apply(pid: int, binds: list[Bind], *, hostname: str | None = None) -> None:
    """Bind ``binds`` into the mount namespace of pod process ``pid`` (a mount already on a
    target is left alone) and set the hostname of its UTS namespace. Raises ``RuntimeFailure``."""
    for bind in binds:
        if not _valid_target(bind.target):
            raise RuntimeFailure(f"invalid mount path {bind.target[:80]!r}")
    if hostname is not None and (
        not hostname or len(hostname) >= _MAX_HOSTNAME or "\0" in hostname
    ):
        raise RuntimeFailure(f"invalid hostname {hostname[:80]!r}")
    fds: list[int] = []
    try:
        mnt_ns = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        fds.append(mnt_ns)
        uts_ns = os.open(f"/proc/{pid}/ns/uts", os.O_RDONLY | os.O_CLOEXEC)
        fds.append(uts_ns)
        trees = []
        for bind in binds:
            trees.append(_clone(bind.source, read_only=bind.read_only))
            fds.append(trees[-1])
            st = os.fstat(trees[-1])
            if bind.identity is not None and f"{st.st_dev}:{st.st_ino}" != bind.identity:
                # The path was resolved again: a name on its way was swapped since the check.
                raise RuntimeFailure(
                    f"refused: {bind.source} is not the folder checked beneath the data dir"
                )
        mounted = _mount_points(pid)
        todo = [(t, b) for t, b in zip(trees, binds, strict=True) if b.target not in mounted]
        _in_child(mnt_ns, uts_ns, todo, hostname)
    except OSError as e:
        raise RuntimeFailure(f"cannot reach the pod's namespaces: {e}") from e
    finally:
        for fd in fds:
            os.close(fd)


def _in_child(
    mnt_ns: int, uts_ns: int, trees: list[tuple[int, Bind]], hostname: str | None
) -> None:

    def enter(at: _Step) -> None:
        at.step = 1
        if _libc.setns(uts_ns, _CLONE_NEWUTS) != 0:
            raise OSError(ctypes.get_errno(), "setns uts")
        if hostname is not None:
            name = hostname.encode()
            at.step = 2
            if _libc.sethostname(name, len(name)) != 0:
                raise OSError(ctypes.get_errno(), "sethostname")
        at.step = 3
        if _libc.setns(mnt_ns, _CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "setns mnt")
        os.chdir("/")
        for i, (tree, bind) in enumerate(trees):
            at.step = 10 + i
            _make_dirs(bind.target, bind.owner)
            syscall = _libc.syscall
            syscall.restype = ctypes.c_long
            if (
                syscall(
                    _SYS_MOVE_MOUNT,
                    tree,
                    b"",
                    _AT_FDCWD,
                    bind.target.encode(),
                    _MOVE_MOUNT_F_EMPTY_PATH,
                )
                != 0
            ):
                raise OSError(ctypes.get_errno(), "move_mount")

    code, step = _forked(enter)
    if code:
        what = (
            "cannot set the pod's hostname"
            if step < 3
            else "cannot enter the pod's mount namespace"
            if step < 10
            else f"cannot mount {trees[step - 10][1].target} in the pod"
        )
        raise RuntimeFailure(f"{what}: {os.strerror(code) if code != 255 else 'error'}")


_MS_BIND = 0x1000
_MS_REC = 0x4000
_MNT_DETACH = 0x2
NEXT_ROOT = "/.torpor-next-root"


def switch_root(pid: int, new_root: Path, *, owner: int) -> None:
    """Make host folder ``new_root`` (a mounted root filesystem) the root of every process of
    the pod of ``pid``, keeping the pod's mounts (``/proc``, ``/dev``, ``/run``, its ``/etc``
    files, the daemon's code): ``pivot_root`` moves each process whose root is the old root to
    the new one, and the old one is detached. What ``pivot_root`` does not move: a process's
    current directory below the old root (the daemon changes its own at claim)."""
    points = sorted(_mount_points(pid) - {"/"}, key=lambda p: (p.count("/"), p))
    top: list[str] = []
    for point in points:
        if point != NEXT_ROOT and not any(point.startswith(t.rstrip("/") + "/") for t in top):
            top.append(point)
    fds: list[int] = []
    try:
        mnt_ns = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        fds.append(mnt_ns)
        tree = _clone_plain(new_root)
        fds.append(tree)
        kinds = [_kind(pid, point) for point in top]
        _in_child_switch(mnt_ns, tree, list(zip(top, kinds, strict=True)), owner)
    except OSError as e:
        raise RuntimeFailure(f"cannot reach the pod's namespaces: {e}") from e
    finally:
        for fd in fds:
            os.close(fd)


def _clone_plain(source: Path) -> int:
    syscall = _libc.syscall
    syscall.restype = ctypes.c_long
    fd = syscall(_SYS_OPEN_TREE, _AT_FDCWD, str(source).encode(), _OPEN_TREE_CLONE | os.O_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise RuntimeFailure(f"cannot clone {source} for a pod: {os.strerror(err)}")
    return int(fd)


def _kind(pid: int, point: str) -> bool:
    """Whether the mount point is a folder (else a file), as the pod sees it."""
    return os.path.isdir(f"/proc/{pid}/root{point}")


def _in_child_switch(mnt_ns: int, tree: int, points: list[tuple[str, bool]], owner: int) -> None:

    def switch(at: _Step) -> None:
        syscall = _libc.syscall
        syscall.restype = ctypes.c_long
        if _libc.setns(mnt_ns, _CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "setns mnt")
        os.chdir("/")
        at.step = 1
        _make_dirs(NEXT_ROOT, 0)
        if syscall(_SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, NEXT_ROOT.encode(), 4) != 0:
            raise OSError(ctypes.get_errno(), "move_mount")
        for i, (point, is_dir) in enumerate(points):
            at.step = 10 + i
            target = NEXT_ROOT + point
            if is_dir:
                _make_dirs(target, owner)
            else:
                parent = target.rsplit("/", 1)[0]
                _make_dirs(parent, owner)
                if not os.path.lexists(target):
                    os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o644))
                    os.chown(target, owner, owner)
            if _libc.mount(point.encode(), target.encode(), None, _MS_BIND | _MS_REC, None):
                raise OSError(ctypes.get_errno(), "bind")
        at.step = 2
        os.chdir(NEXT_ROOT)
        if _libc.syscall(_SYS_PIVOT_ROOT, b".", b".") != 0:
            raise OSError(ctypes.get_errno(), "pivot_root")
        at.step = 3
        if _libc.umount2(b".", _MNT_DETACH) != 0:
            raise OSError(ctypes.get_errno(), "umount")

    code, step = _forked(switch)
    if code:
        reason = os.strerror(code) if code != 255 else "error"
        raise RuntimeFailure(f"cannot switch the pod's root (step {step}): {reason}")


@dataclass
class _Step:
    """How far the forked helper got (its failure message names the step)."""

    step: int = 0


def _forked(body: Callable[[_Step], None]) -> tuple[int, int]:
    """Run ``body`` in a forked helper (system calls only there, then ``_exit``); its (errno, or
    255 for any other failure, or 0; the step it reached)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code, at = 0, _Step()
        try:
            os.close(read)
            body(at)
        except OSError as e:
            code = e.errno or 1
        except BaseException:
            code = 255
        with contextlib.suppress(BaseException):
            os.write(write, struct.pack("ii", code, at.step))
        os._exit(0)
    os.close(write)
    return _outcome(pid, read)


def _outcome(pid: int, read: int) -> tuple[int, int]:
    """The forked helper's (errno, step it reached), read from its pipe; the helper is reaped."""
    try:
        data = b""
        while len(data) < 8:
            chunk = os.read(read, 8 - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    if len(data) < 8:
        raise RuntimeFailure("the helper that enters the pod died")
    code, step = struct.unpack("ii", data)
    return code, step


def _make_dirs(target: str, owner: int) -> None:
    path = ""
    for part in target.strip("/").split("/"):
        path += "/" + part
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            continue
        os.chown(path, owner, owner)


def _mount_points(pid: int) -> set[str]:
    """Mount points of the pod's namespace, as the pod sees them."""
    with open(f"/proc/{pid}/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        return {mounts.unescape(line.split(" ", 5)[4]) for line in f if line.count(" ") >= 5}
