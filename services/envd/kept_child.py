"""The child process of ``/kept-files`` (``services.envd.archive``), run by path as
``python -I -S kept_child.py export KEPT_ROOT`` or ``... import KEPT_ROOT LIMIT UID|- GID|-``:
standard library only, so it starts in a few tens of milliseconds (a resume into a warm pod
waits for the import). The import drops to UID/GID itself once its code is loaded (the daemon's
code may be readable by root only). See ``services.envd.archive`` for what each mode does.

Import answers one JSON line on stdout: ``{"ok": true, "files": n, "bytes": b}`` or
``{"ok": false, "status": 4xx, "message": ...}``; export writes the tar to stdout and only
errors to stderr.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tarfile
from typing import IO

KEPT_DIRS = ("home/user", "workspace")


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def child_main(argv: list[str]) -> int:
    mode, kept_root = argv[0], argv[1]
    if mode == "export":
        with tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for top in KEPT_DIRS:
                _export_tree(tar, os.path.join(kept_root, top), top)
        sys.stdout.flush()
        return 0
    limit = int(argv[2])
    if argv[3] != "-":  # the sandbox's user, before reading a byte of the tar
        os.setgroups([])
        os.setgid(int(argv[4]))
        os.setuid(int(argv[3]))
    try:
        files, total = _import_tar(sys.stdin.buffer, kept_root, limit)
    except Refused as e:
        print(json.dumps({"ok": False, "status": e.status, "message": str(e)}))
        return 2
    print(json.dumps({"ok": True, "files": files, "bytes": total}))
    return 0


class _Padded:
    """Exactly ``size`` bytes of an open file: zeros after a premature end (it shrank)."""

    def __init__(self, fh: IO[bytes], size: int) -> None:
        self._fh, self._left = fh, size

    def read(self, n: int = -1) -> bytes:
        n = self._left if n < 0 else min(n, self._left)
        data = self._fh.read(n)
        data += b"\0" * (n - len(data))
        self._left -= n
        return data


def _export_tree(tar: tarfile.TarFile, top: str, arc_top: str) -> None:
    if not os.path.isdir(top) or os.path.islink(top):
        return
    for dirpath, dirnames, filenames, dirfd in os.fwalk(top, follow_symlinks=False):
        rel = os.path.relpath(dirpath, top)
        arc_dir = arc_top if rel == "." else f"{arc_top}/{rel}"
        if rel != ".":
            st = os.fstat(dirfd)
            tar.addfile(_info(arc_dir, st, tarfile.DIRTYPE))
        for name in filenames + [d for d in dirnames if _is_link(name=d, dirfd=dirfd)]:
            _export_entry(tar, dirfd, name, f"{arc_dir}/{name}")


def _is_link(*, name: str, dirfd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _export_entry(tar: tarfile.TarFile, dirfd: int, name: str, arcname: str) -> None:
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            info = _info(arcname, st, tarfile.SYMTYPE)
            info.linkname = os.readlink(name, dir_fd=dirfd)
            tar.addfile(info)
            return
        if not stat.S_ISREG(st.st_mode):
            return  # sockets, fifos, devices: not files anyone keeps
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dirfd)
    except (FileNotFoundError, PermissionError):
        return  # gone meanwhile
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            return
        info = _info(arcname, st, tarfile.REGTYPE)
        info.size = st.st_size
        tar.addfile(info, _Padded(fh, st.st_size))


def _info(arcname: str, st: os.stat_result, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(arcname)
    info.type = kind
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = int(st.st_mtime)
    info.uid, info.gid = st.st_uid, st.st_gid
    return info


def _import_tar(source: IO[bytes], kept_root: str, limit: int) -> tuple[int, int]:
    roots = {top: os.path.join(kept_root, top) for top in KEPT_DIRS}
    files = total = 0
    try:
        with tarfile.open(fileobj=source, mode="r|") as tar:
            for member in tar:
                name = member.name
                if "\x00" in name or "\x00" in member.linkname:
                    raise Refused(400, "a member name contains a NUL byte")
                top, rest = _split(name)
                if top is None:
                    raise Refused(400, f"member {name[:200]!r} is not under {KEPT_DIRS}")
                if not rest:
                    continue  # the folder itself: it exists, its mode stays the pod's
                if member.islnk():
                    raise Refused(400, f"member {name[:200]!r}: hard links are not imported")
                if member.issparse():
                    raise Refused(400, f"member {name[:200]!r}: sparse members are not imported")
                total += max(member.size, 0)
                if total > limit:
                    raise Refused(413, f"the archive's files are over the limit of {limit} bytes")
                try:
                    tar.extract(member.replace(name=rest, deep=False), roots[top], filter="data")
                except tarfile.FilterError as e:
                    raise Refused(400, f"member {name[:200]!r} refused: {e}") from None
                files += 1
    except tarfile.TarError as e:
        raise Refused(400, f"not a valid tar: {e}") from None
    except OSError as e:
        raise Refused(400, f"cannot write a member: {e.strerror}") from None
    return files, total


def _split(name: str) -> tuple[str | None, str]:
    clean = name[2:] if name.startswith("./") else name
    for top in KEPT_DIRS:
        if clean == top or clean == top + "/":
            return top, ""
        if clean.startswith(top + "/"):
            return top, clean[len(top) + 1 :]
    return None, ""


if __name__ == "__main__":
    raise SystemExit(child_main(sys.argv[1:]))
