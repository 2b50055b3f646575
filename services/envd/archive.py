"""``GET /kept-files`` and ``POST /kept-files``: the sandbox's writable paths (``/home/user``,
``/workspace``) as one uncompressed tar, out and in. The control plane uses them where a pod's
disk does not outlive it (Kubernetes ``persist: store``): the export at pause goes into the
kept-files store, the import puts it into the next pod (cold or warm) before any process of the
sandbox is replayed.

Member names are ``home/user/...`` and ``workspace/...``. The work happens in a child process
(``services/envd/kept_child.py``, standard library only: it starts fast), so a big tree never
blocks the daemon's event loop:

- **export** (``GET``, optional ``hold=SECONDS``, 0 to 600, default 0) stops the sandbox's
  processes first (``services.envd.freezing``): the tar is one moment's tree, and nothing
  written after it is lost unseen. With ``hold`` 0 they continue once the tar is sent; else they
  stay stopped until ``POST /kept-files/thaw`` or ``hold`` seconds after the tar ended (a pause
  that dies half-way never leaves a sandbox stopped for good); the pod of a pause stops with
  them stopped. An export that fails continues them at once (unless an earlier hold still
  runs). A repeat while stopped (a redelivered pause, a snapshot) stops what appeared since,
  exports again and never shortens a hold that runs. From the start of an export with a hold
  until it ends, the daemon's API refuses what would change the sandbox (``holding``,
  ``services.envd.holding``); such an export first waits for the writes admitted before it
  (an upload streaming in) to end, and refuses (409) when they do not within 30 s. The export
  child itself runs as the daemon (root: it must read what root left in the home folder) and
  walks with directory descriptors, never following a symlink (``os.fwalk``, ``O_NOFOLLOW``):
  a process swapping a folder for a link mid-walk cannot make it read outside. Regular files,
  folders and symlinks only; a file that shrinks while read is padded, one that grows cut.
- **import** runs as the sandbox's user (the child drops to it before reading the tar: files
  land owned by it, and nothing the user could not write is writable), extracting by hand
  (the images' python, Debian's 3.11.2, has no ``tarfile`` filters): every folder on the way
  and the file opened with ``O_NOFOLLOW`` (nothing is written through a link), no absolute
  names, no ``..``, no link leaving its folder, files, folders and links only,
  setuid/setgid/sticky and group/other write bits dropped, plus: only names under the two
  folders, no hard links, no sparse members, the sum of member sizes at most ``limit``.
  The first refused member stops the import (4xx JSON). Allowed once per daemon, and only
  until a process is started through the API: the control plane imports before it replays
  anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from services.envd.files_http import Receive, Scope, Send, query, send_error, send_json
from services.envd.freezing import FreezeFailed, Freezer
from services.envd.holding import WritesInFlight
from services.envd.users import Identity

log = logging.getLogger("envd")

MAX_IMPORT_BYTES = 64 * 1024**3  # the daemon's own ceiling on ``limit``
MAX_HOLD_SECONDS = 600
DRAIN_SECONDS = 30.0  # how long an export with a hold waits for writes admitted before it
CHUNK = 256 * 1024
_CHILD = str(Path(__file__).resolve().with_name("kept_child.py"))


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class KeptFilesApi:
    def __init__(
        self,
        *,
        kept_root: str,
        user: Any,
        freezer: Freezer | None = None,
        writes: WritesInFlight | None = None,
        drain_seconds: float = DRAIN_SECONDS,
    ) -> None:
        self._kept_root = kept_root
        self._writes = writes or WritesInFlight()
        self._drain_seconds = drain_seconds
        self._user = user  # () -> Identity: the sandbox's user, resolved at each import
        self.closed: str | None = None  # why an import is refused from now on
        self._importing = False
        self.freezer = freezer or Freezer()
        # One export or thaw at a time: a thaw never lands in the middle of an export.
        self._freezing = asyncio.Lock()
        self._auto_thaw: asyncio.TimerHandle | None = None
        self._held_until = 0.0  # the loop's time the current hold ends; 0: none
        self._exporting_to_hold = False  # an export with a hold runs (freezing or sending)

    @property
    def holding(self) -> bool:
        """Whether the sandbox is held for a pause: from the start of an export with a hold
        (before its freeze) until the thaw or the hold's end. The daemon's API then refuses
        what would change the sandbox (``services.envd.holding``)."""
        return self._exporting_to_hold or self._held_until > 0

    def close_imports(self, why: str) -> None:
        if self.closed is None:
            self.closed = why

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/kept-files/thaw":
            if query(scope):
                await send_error(send, 400, "kept-files/thaw takes no parameters")
            elif scope["method"] == "POST":
                await self._thaw(send)
            else:
                await send_error(send, 405, "kept-files/thaw: POST continues a held sandbox")
        elif scope["method"] == "GET":
            await self._export(scope, send)
        elif scope["method"] == "POST":
            await self._import(scope, receive, send)
        else:
            await send_error(send, 405, "kept-files: GET exports, POST imports")

    async def _thaw(self, send: Send) -> None:
        async with self._freezing:
            self._cancel_auto_thaw()
            self._held_until = 0.0
            continued = self.freezer.thaw()
        if continued:
            log.info("kept-files: %d processes continued", continued)
        await send_json(send, 200, {"continued": continued})

    def _cancel_auto_thaw(self) -> None:
        if self._auto_thaw is not None:
            self._auto_thaw.cancel()
            self._auto_thaw = None

    def _thaw_after_hold(self) -> None:
        # Only ever pending while no export runs (each cancels it first, under the lock).
        self._auto_thaw = None
        self._held_until = 0.0
        continued = self.freezer.thaw()
        log.warning("kept-files: hold over, %d processes continued", continued)

    async def _export(self, scope: Scope, send: Send) -> None:
        try:
            hold = _hold(query(scope))
        except Refused as e:
            await send_error(send, e.status, str(e))
            return
        async with self._freezing:
            self._cancel_auto_thaw()  # this export decides how long they stay stopped
            self._exporting_to_hold = hold > 0  # writes refused from before the freeze on
            try:
                if hold > 0 and not await self._writes.drained(self._drain_seconds):
                    # Tarring now would keep half of it, and lose the rest with the pod.
                    msg = f"{self._writes.count} writes through the API did not end in time"
                    self._hold_on(0)  # an earlier hold still runs out
                    await send_error(send, 409, f"kept-files export refused: {msg}")
                    return
                try:
                    frozen = await self._freeze()
                except FreezeFailed as e:  # it continued everything, an earlier hold's too
                    self._held_until = 0.0
                    await send_error(send, 500, f"kept-files export refused: {e}")
                    return
                done = False
                try:
                    done = await self._send_export(send, frozen)
                finally:
                    self._hold_on(hold if done else 0)
            finally:
                self._exporting_to_hold = False

    def _hold_on(self, hold: int) -> None:
        """After an export: held ``hold`` seconds more, or as long as an earlier export's hold
        still runs (a snapshot while a pause holds the sandbox ends nothing), else continued."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        until = max(self._held_until, now + hold if hold else 0.0)
        if until <= now:
            self._held_until = 0.0
            self.freezer.thaw()
            return
        self._held_until = until
        self._auto_thaw = loop.call_at(until, self._thaw_after_hold)

    async def _freeze(self) -> int:
        # In a thread (it waits for processes to stop); never left half-done by a cancel.
        freezing = asyncio.ensure_future(asyncio.to_thread(self.freezer.freeze))
        try:
            return await asyncio.shield(freezing)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await freezing
            self.freezer.thaw()
            raise

    async def _send_export(self, send: Send, frozen: int) -> bool:
        """The tar to the client; whether all of it was sent."""
        try:
            proc = await _spawn(("export", self._kept_root), stdin=asyncio.subprocess.DEVNULL)
        except OSError as e:
            await send_error(send, 500, f"kept-files export could not start: {e.strerror}")
            return False
        assert proc.stdout is not None
        assert proc.stderr is not None
        first = await proc.stdout.read(CHUNK)
        if not first:
            err = (await proc.stderr.read()).decode(errors="replace")[-500:]
            await proc.wait()
            await send_error(send, 500, f"kept-files export failed: {err.strip()}")
            return False
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/x-tar"),
                    (b"x-frozen-processes", str(frozen).encode()),
                ],
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
        return True

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
        # The child drops to the user itself, once its code is loaded: the daemon's code may
        # be readable by the daemon only (a bubblewrap pod binds it from the host).
        ids = ["-", "-"] if identity.is_self else [str(identity.uid), str(identity.gid)]
        try:
            proc = await _spawn(
                ("import", self._kept_root, str(limit), *ids), stdin=asyncio.subprocess.PIPE
            )
        except OSError as e:
            raise Refused(500, f"kept-files import could not start: {e.strerror}") from None
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


def _hold(params: dict[str, str]) -> int:
    unknown = sorted(set(params) - {"hold"})
    if unknown:
        raise Refused(400, f"kept-files export takes only hold, not {unknown[0][:40]!r}")
    raw = params.get("hold")
    if raw is None:
        return 0
    if not raw.isascii() or not raw.isdigit() or len(raw) > 3 or int(raw) > MAX_HOLD_SECONDS:
        raise Refused(400, f"hold must be an integer from 0 to {MAX_HOLD_SECONDS} (seconds)")
    return int(raw)


def _limit(raw: str | None) -> int:
    if raw is None or not raw.isascii() or not raw.isdigit() or len(raw) > 15:
        raise Refused(400, f"limit must be an integer from 1 to {MAX_IMPORT_BYTES}")
    value = int(raw)
    if not 1 <= value <= MAX_IMPORT_BYTES:
        raise Refused(400, f"limit must be an integer from 1 to {MAX_IMPORT_BYTES}")
    return value


async def _spawn(args: tuple[str, ...], *, stdin: int) -> asyncio.subprocess.Process:
    """The archive child with ``args``; its stdout and stderr piped to the daemon."""
    return await asyncio.create_subprocess_exec(
        *_child(*args),
        stdin=stdin,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_child_env(),
        cwd="/",
    )


def _child(*args: str) -> list[str]:
    # -I -S: no PYTHON* variables, no cwd or user site, no site-packages on the path: nothing
    # the sandbox wrote is imported into a child that may run as root; the standard library
    # only, so it starts fast.
    return [sys.executable, "-I", "-S", _CHILD, *args]


def _child_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}
