"""``GET /kept-files`` and ``POST /kept-files``: the sandbox's writable paths (``/home/user``,
``/workspace``) as one uncompressed tar, out and in. The control plane uses them where a pod's
disk does not outlive it (Kubernetes ``persist: store``): the export at pause goes into the
kept-files store, the import puts it into the next pod (cold or warm) before any process of the
sandbox is replayed.

Member names are ``home/user/...`` and ``workspace/...``. The work happens in a child process
(``python -m services.envd.archive export|import``), so a big tree never blocks the daemon's
event loop:

- **export** runs as the daemon (root: it must read what root left in the home folder) and
  walks with directory descriptors, never following a symlink (``os.fwalk``, ``O_NOFOLLOW``):
  a process swapping a folder for a link mid-walk cannot make it read outside. Regular files,
  folders and symlinks only; a file that shrinks while read is padded, one that grows cut.
- **import** runs as the sandbox's user (files land owned by it, and nothing the user could
  not write is writable), with ``tarfile``'s ``data`` filter (no absolute names, no ``..``, no
  link leaving its folder, no device or fifo, setuid/setgid/sticky and group/other write bits
  dropped), plus: only names under the two folders, no hard links, no sparse members, the sum
  of member sizes at most ``limit``. The first refused member stops the import (4xx JSON).
  Allowed once per daemon, and only until a process is started through the API: the control
  plane imports before it replays anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import sys
import tarfile
from pathlib import Path
from typing import IO, Any

from services.envd.files_http import Receive, Scope, Send, query, send_error, send_json
from services.envd.users import Identity

KEPT_DIRS = ("home/user", "workspace")
MAX_IMPORT_BYTES = 64 * 1024**3  # the daemon's own ceiling on ``limit``
CHUNK = 256 * 1024
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # where ``services`` lives


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class KeptFilesApi:
    def __init__(self, *, kept_root: str, user: Any) -> None:
        self._kept_root = kept_root
        self._user = user  # () -> Identity: the sandbox's user, resolved at each import
        self.closed: str | None = None  # why an import is refused from now on
        self._importing = False

    def close_imports(self, why: str) -> None:
        if self.closed is None:
            self.closed = why

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] == "GET":
            await self._export(send)
        elif scope["method"] == "POST":
            await self._import(scope, receive, send)
        else:
            await send_error(send, 405, "kept-files: GET exports, POST imports")

    async def _export(self, send: Send) -> None:
        proc = await asyncio.create_subprocess_exec(
            *_child("export", self._kept_root),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=_child_env(),
            cwd="/",
        )
        assert proc.stdout is not None
        assert proc.stderr is not None
        first = await proc.stdout.read(CHUNK)
        if not first:
            err = (await proc.stderr.read()).decode(errors="replace")[-500:]
            await proc.wait()
            await send_error(send, 500, f"kept-files export failed: {err.strip()}")
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/x-tar")],
            }
        )
        try:
            chunk = first
            while chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                chunk = await proc.stdout.read(CHUNK)
            # Not the exit code: the process table reaps every child (SIGCHLD), so asyncio
            # may never see it. The child writes to stderr only when it fails.
            err = (await proc.stderr.read()).decode(errors="replace")
            await proc.wait()
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if err.strip():
            # Headers are gone: end the stream short, so the reader's tar is truncated and it
            # fails (a tar is only complete with its end-of-archive blocks).
            raise RuntimeError(f"kept-files export failed: {err.strip()[-300:]}")
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _import(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            limit = _limit(query(scope).get("limit"))
            if self.closed is not None:
                raise Refused(409, f"kept files are imported only into a fresh pod: {self.closed}")
            if self._importing:
                raise Refused(409, "an import is already running")
        except Refused as e:
            await send_error(send, e.status, str(e))
            return
        self._importing = True
        try:
            identity: Identity = self._user()
            result = await self._run_import(identity, limit, receive)
        except Refused as e:
            await send_error(send, e.status, str(e))
            return
        finally:
            self._importing = False
        self.close_imports("imported already")
        await send_json(send, 200, result)

    async def _run_import(self, identity: Identity, limit: int, receive: Receive) -> Any:
        switch: dict[str, Any] = {}
        if not identity.is_self:
            switch = {"user": identity.uid, "group": identity.gid, "extra_groups": []}
        proc = await asyncio.create_subprocess_exec(
            *_child("import", self._kept_root, str(limit)),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=_child_env(),
            cwd="/",
            **switch,
        )
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        received = 0
        over = False
        reading = True
        try:
            while True:
                message = await receive()
                body = message.get("body", b"")
                received += len(body)
                # The tar's headers and padding on top of its contents: 1 KiB per 512 B member
                # at worst is far below this slack for any real tree.
                if received > limit + limit // 8 + 1024 * 1024:
                    over = True
                    break
                if body and reading:
                    try:
                        proc.stdin.write(body)
                        await proc.stdin.drain()
                    except (BrokenPipeError, ConnectionResetError):
                        # It refused a member, or the tar ended: the rest is only counted.
                        reading = False
                if not message.get("more_body", False):
                    break
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.close()
            if over:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            out, err = await proc.communicate()
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if over:
            raise Refused(413, f"kept-files import is over its limit of {limit} bytes")
        try:
            result = json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            tail = err.decode(errors="replace").strip()[-300:]
            raise Refused(500, f"kept-files import failed: {tail}") from None
        if not result.get("ok"):
            raise Refused(int(result.get("status", 400)), str(result.get("message", "refused")))
        return {"files": result["files"], "bytes": result["bytes"]}


def _limit(raw: str | None) -> int:
    if raw is None or not raw.isascii() or not raw.isdigit() or len(raw) > 15:
        raise Refused(400, f"limit must be an integer from 1 to {MAX_IMPORT_BYTES}")
    value = int(raw)
    if not 1 <= value <= MAX_IMPORT_BYTES:
        raise Refused(400, f"limit must be an integer from 1 to {MAX_IMPORT_BYTES}")
    return value


def _child(*args: str) -> list[str]:
    return [sys.executable, "-I", "-c", _BOOT, *args]


# -I (isolated): no PYTHON* variables and no cwd or user site on the path, so nothing the
# sandbox wrote can be imported into a child that may run as root; the package root is added
# explicitly (it is the daemon's own code, outside the sandbox's writable paths).
_BOOT = (
    f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r}); "
    "from services.envd.archive import child_main; raise SystemExit(child_main(sys.argv[1:]))"
)


def _child_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}


# ---- the child process ---------------------------------------------------------------------


def child_main(argv: list[str]) -> int:
    mode, kept_root = argv[0], argv[1]
    if mode == "export":
        with tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for top in KEPT_DIRS:
                _export_tree(tar, os.path.join(kept_root, top), top)
        sys.stdout.flush()
        return 0
    limit = int(argv[2])
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
