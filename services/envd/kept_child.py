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

import contextlib
import errno
import json
import os
import posixpath
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
                _extract(tar, member, roots[top], rest)
                files += 1
    except tarfile.TarError as e:
        raise Refused(400, f"not a valid tar: {e}") from None
    except OSError as e:
        raise Refused(400, f"cannot write a member: {e.strerror}") from None
    return files, total


# Written by hand, not tarfile's extraction filters: the images' python (Debian bookworm's
# 3.11.2) predates them (``filter=`` and ``tarfile.FilterError`` arrived in 3.11.4).
_SAFE_BITS = 0o755  # no setuid/setgid/sticky, no group/other write


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, root: str, rest: str) -> None:
    """``member`` at ``rest`` under ``root``: every folder on the way and the file itself opened
    without following a link, so nothing is written through a link, planted or imported (that
    is the guarantee; the link check below is a second line: relative and lexically inside
    ``root``); only files, folders and links."""
    shown = repr(member.name[:200])
    parts = [p for p in rest.split("/") if p not in ("", ".")]
    if not parts:
        return
    if ".." in parts:
        raise Refused(400, f"member {shown} refused: it leads outside its folder")
    if member.isdir():
        os.close(_open_dirs(root, parts, shown, mode=member.mode))
        return
    if not (member.isreg() or member.issym()):
        raise Refused(400, f"member {shown} refused: only files, folders and links are imported")
    parent = _open_dirs(root, parts[:-1], shown)
    try:
        if member.issym():
            target = member.linkname
            inside = posixpath.normpath(
                posixpath.join(*parts[:-1], target) if parts[:-1] else target
            )
            if target.startswith("/") or inside == ".." or inside.startswith("../"):
                raise Refused(400, f"member {shown} refused: its link leads outside its folder")
            os.symlink(target, parts[-1], dir_fd=parent)
            return
        # O_NONBLOCK: a fifo in its place fails at once instead of waiting for a reader
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
        fd = os.open(parts[-1], flags, 0o600, dir_fd=parent)
        with os.fdopen(fd, "wb") as out:
            source = tar.extractfile(member)
            assert source is not None  # a regular member
            while chunk := source.read(1 << 20):
                out.write(chunk)
            os.fchmod(out.fileno(), (member.mode & _SAFE_BITS) | 0o600)
            os.utime(out.fileno(), (member.mtime, member.mtime))
    except FileExistsError:
        raise Refused(400, f"member {shown} refused: its name exists already") from None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise Refused(
                400, f"member {shown} refused: a link or folder is in its place"
            ) from None
        raise
    finally:
        os.close(parent)


def _open_dirs(root: str, parts: list[str], shown: str, *, mode: int | None = None) -> int:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Refused(
                        400, f"member {shown} refused: a link or file is in its way"
                    ) from None
                raise
            os.close(fd)
            fd = inner
            if mode is not None and i == len(parts) - 1:
                os.fchmod(fd, (mode & _SAFE_BITS) | 0o700)
        return fd
    except BaseException:
        os.close(fd)
        raise


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
