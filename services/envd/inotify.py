"""A tiny inotify watcher (ctypes, no threads) with fsnotify's event vocabulary.

Real envd uses Go's fsnotify; its mapping is kept: IN_CREATE and IN_MOVED_TO are *create*,
IN_MODIFY is *write*, IN_DELETE is *remove*, IN_MOVED_FROM is *rename*, IN_ATTRIB is *chmod*.
Names are reported relative to the watched directory. Recursive watches add a watch for every
sub-directory, including ones created later.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import struct
from collections.abc import Callable

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_IGNORED = 0x00008000
IN_ISDIR = 0x40000000
IN_Q_OVERFLOW = 0x00004000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_MASK = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
_HEADER = struct.Struct("iIII")

_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


# statfs(2) f_type of the filesystems E2B's envd counts as network mounts.
NETWORK_FS_MAGIC = frozenset(
    {
        0x6969,  # NFS
        0x517B,  # SMB
        0xFF534D42,  # CIFS
        0xFE534D42,  # SMB2
        0x65735546,  # FUSE
        0x01021997,  # 9P (v9fs)
        0x564C,  # NCP
        0x73757245,  # CODA
        0x47504653,  # GPFS
        0x5346414F,  # AFS
        0x6B414653,  # kAFS
        0x0BD00BD0,  # Lustre
        0x19830326,  # fhgfs/BeeGFS
        0x00C36400,  # CephFS
    }
)


def filesystem_magic(path: str) -> int:
    """``statfs(path).f_type`` (``f_type`` is the first ``long`` of ``struct statfs``)."""
    buf = ctypes.create_string_buffer(256)  # sizeof(struct statfs) is 120 on 64-bit Linux
    if _lib().statfs(os.fsencode(path), buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def is_network_filesystem(path: str) -> bool:
    return filesystem_magic(path) in NETWORK_FS_MAGIC


def kind_of(mask: int) -> str | None:
    if mask & (IN_CREATE | IN_MOVED_TO):
        return "create"
    if mask & IN_MODIFY:
        return "write"
    if mask & IN_DELETE:
        return "remove"
    if mask & IN_MOVED_FROM:
        return "rename"
    if mask & IN_ATTRIB:
        return "chmod"
    return None


class Watcher:
    """Calls ``on_event(kind, name, full_path)`` from the event loop for every change."""

    def __init__(
        self, path: str, *, recursive: bool, on_event: Callable[[str, str, str], None]
    ) -> None:
        self._root = path
        self._recursive = recursive
        self._on_event = on_event
        self._wds: dict[int, str] = {}
        fd = _lib().inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        try:
            self._add(path)
            if recursive:
                for dirpath, dirnames, _ in os.walk(path):
                    for name in dirnames:
                        self._add(os.path.join(dirpath, name))
        except OSError:
            os.close(fd)
            raise
        self._loop.add_reader(fd, self._read)

    def _add(self, path: str) -> None:
        wd = _lib().inotify_add_watch(self._fd, os.fsencode(path), _MASK)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        self._wds[wd] = path

    def drain(self) -> None:
        """Deliver every event queued in the kernel now (without waiting for the loop)."""
        while self._fd >= 0 and self._read():
            pass

    def _read(self) -> bool:
        if self._fd < 0:
            return False
        try:
            buf = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return False
        except OSError:
            self.close()
            return False
        offset = 0
        while offset + _HEADER.size <= len(buf):
            wd, mask, _cookie, length = _HEADER.unpack_from(buf, offset)
            offset += _HEADER.size
            raw = buf[offset : offset + length].rstrip(b"\x00")
            offset += length
            if mask & IN_IGNORED:
                self._wds.pop(wd, None)
                continue
            base = self._wds.get(wd)
            if base is None or not raw:
                continue
            full = os.path.join(base, os.fsdecode(raw))
            if self._recursive and mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
                with contextlib.suppress(OSError):
                    self._add(full)
            kind = kind_of(mask)
            if kind is not None:
                self._on_event(kind, os.path.relpath(full, self._root), full)
        return True

    def close(self) -> None:
        if self._fd < 0:
            return
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = -1
