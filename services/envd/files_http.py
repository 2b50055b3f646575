"""``GET/POST /files``: download and upload, as envd's plain-HTTP API does it.

Uploads are ``application/octet-stream`` (streamed to the file, optionally
``Content-Encoding: gzip``) or ``multipart/form-data`` (field ``file``; the part's filename is the
path when no ``path`` parameter is given; buffered up to ``MAX_MULTIPART_BYTES``). Files are
written in place like envd does (never renamed over: the target may be a device). Errors are
JSON ``{"code": <status>, "message": ...}``: 400 bad path or request, 404 missing file, 413 too
large, 507 out of space.

Requests act as the SDK's user (``username`` parameter or Basic auth, ``services.envd.users``):
relative paths resolve against its home, and after opening the target the daemon chowns it to
that user (folders it creates too), as envd does: a watcher sees E2B's sequence for a new file,
*create*, *chmod*, *write*.
``X-Metadata-*`` headers become ``user.e2b.*`` extended attributes (``services.envd.metadata``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import zlib
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from services.envd import metadata as file_metadata
from services.envd.paths import BadPath, resolve
from services.envd.users import Identity, UnknownUser, Users, basic_auth_user

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

MAX_MULTIPART_BYTES = 256 * 1024 * 1024
DOWNLOAD_CHUNK = 256 * 1024


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def send_json(send: Send, status: int, body: object) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


async def send_error(send: Send, status: int, message: str) -> None:
    await send_json(send, status, {"code": status, "message": message})


def header(scope: Scope, name: bytes) -> str:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return ""


def query(scope: Scope) -> dict[str, str]:
    parsed = parse_qs(bytes(scope.get("query_string", b"")).decode(), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items()}


def _os_error(exc: OSError, path: str) -> HttpError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return HttpError(507, f"not enough disk space to write {path!r}")
    if isinstance(exc, FileNotFoundError):
        return HttpError(404, f"path {path!r} not found")
    if isinstance(exc, PermissionError):
        return HttpError(403, f"permission denied: {path!r}")
    if isinstance(exc, (IsADirectoryError, NotADirectoryError)):
        return HttpError(400, f"path {path!r} is a directory or has a file as parent")
    return HttpError(500, f"{path!r}: {exc.strerror or exc}")


class FilesApi:
    def __init__(self, *, users: Users) -> None:
        self._users = users

    def _resolve(self, raw: str, who: Identity) -> str:
        try:
            return resolve(raw, who.home, who.home)
        except BadPath as exc:
            raise HttpError(400, str(exc)) from exc

    def _who(self, scope: Scope) -> Identity:
        try:
            name = query(scope).get("username") or basic_auth_user(header(scope, b"authorization"))
            return self._users.resolve(name)
        except UnknownUser as exc:
            raise HttpError(401, str(exc)) from exc

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            who = self._who(scope)
            if scope["method"] == "GET":
                await self._download(scope, send, who)
            elif scope["method"] == "POST":
                result = await self._upload(scope, receive, who)
                await send_json(send, 200, result)
            else:
                raise HttpError(405, "method not allowed")
        except HttpError as exc:
            await send_error(send, exc.status, str(exc))

    async def _download(self, scope: Scope, send: Send, who: Identity) -> None:
        raw = query(scope).get("path", "")
        path = self._resolve(raw, who)
        try:
            fh = open(path, "rb")  # noqa: SIM115 - closed by the with below
        except OSError as exc:
            raise _os_error(exc, raw) from exc
        with fh:
            if not os.path.isfile(path):
                raise HttpError(400, f"path {raw!r} is not a file")
            gzip_it = "gzip" in header(scope, b"accept-encoding").lower()
            headers = [(b"content-type", b"application/octet-stream")]
            if gzip_it:
                headers.append((b"content-encoding", b"gzip"))
            else:
                headers.append((b"content-length", str(os.fstat(fh.fileno()).st_size).encode()))
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            compressor = zlib.compressobj(1, zlib.DEFLATED, 31) if gzip_it else None
            while chunk := fh.read(DOWNLOAD_CHUNK):
                if compressor is not None:
                    chunk = compressor.compress(chunk)
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            tail = compressor.flush() if compressor is not None else b""
            await send({"type": "http.response.body", "body": tail})

    async def _upload(self, scope: Scope, receive: Receive, who: Identity) -> list[dict[str, Any]]:
        params = query(scope)
        try:  # before anything is written: a rejected upload creates no file
            meta = file_metadata.from_headers(scope["headers"])
        except file_metadata.MetadataError as exc:
            raise HttpError(400, str(exc)) from exc
        content_type = header(scope, b"content-type")
        if content_type.startswith("multipart/form-data"):
            body = await _read_body(receive, MAX_MULTIPART_BYTES)
            parts = parse_multipart(body, content_type)
            if not parts:
                raise HttpError(400, "no file part in the multipart body")
            written = []
            for filename, data in parts:
                raw = params.get("path") if len(parts) == 1 and params.get("path") else filename
                if not raw:
                    raise HttpError(400, "no path given for an uploaded file")
                written.append(self._write(raw, [data], meta, who))
            return written
        raw = params.get("path", "")
        if not raw:
            raise HttpError(400, "the path parameter is required")
        gzip_body = "gzip" in header(scope, b"content-encoding").lower()
        return [await self._write_stream(raw, receive, gzip_body, meta, who)]

    def _write(
        self, raw: str, chunks: list[bytes], meta: dict[str, str], who: Identity
    ) -> dict[str, Any]:
        path = self._resolve(raw, who)
        fd = self._open_target(raw, path, meta, who)
        try:
            with os.fdopen(fd, "wb") as fh:
                for chunk in chunks:
                    fh.write(chunk)
        except OSError as exc:
            raise _os_error(exc, raw) from exc
        return _written(path, meta)

    async def _write_stream(
        self, raw: str, receive: Receive, gzip_body: bool, meta: dict[str, str], who: Identity
    ) -> dict[str, Any]:
        path = self._resolve(raw, who)
        fd = self._open_target(raw, path, meta, who)
        inflater = zlib.decompressobj(31) if gzip_body else None
        try:
            with os.fdopen(fd, "wb") as fh:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise HttpError(499, "client disconnected during upload")
                    chunk = message.get("body", b"")
                    if inflater is not None and chunk:
                        chunk = inflater.decompress(chunk)
                    if chunk:
                        # Flushed as it arrives: an upload in flight is on disk as far as it has
                        # come, not short by a tail held in this process's buffer.
                        fh.write(chunk)
                        fh.flush()
                    if not message.get("more_body", False):
                        break
                if inflater is not None:
                    fh.write(inflater.flush())
        except zlib.error as exc:
            raise HttpError(400, f"invalid gzip body: {exc}") from exc
        except OSError as exc:
            raise _os_error(exc, raw) from exc
        return _written(path, meta)

    def _open_target(self, raw: str, path: str, meta: dict[str, str], who: Identity) -> int:
        """Open for writing in place (O_TRUNC), as envd does: mode, owner and hard links of an
        existing file are kept, and a device or FIFO is written to, never replaced. Then the
        chown (envd's *chmod* event) and the metadata, before any data."""
        if os.path.isdir(path):
            raise HttpError(400, f"path {raw!r} is a directory")
        try:
            who.own_new_dirs(os.path.dirname(path))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            raise _os_error(exc, raw) from exc
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):
                with contextlib.suppress(OSError):
                    if who.is_self:
                        os.fchown(fd, st.st_uid, st.st_gid)
                    else:
                        os.fchown(fd, who.uid, who.gid)
                file_metadata.replace(fd, meta)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
                raise HttpError(400, f"the filesystem of {raw!r} keeps no metadata") from exc
            raise _os_error(exc, raw) from exc
        return fd


def _written(path: str, meta: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": os.path.basename(path), "type": "file", "path": path}
    if meta:
        out["metadata"] = meta
    return out


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HttpError(499, "client disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise HttpError(413, f"request body exceeds {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _boundary(content_type: str) -> bytes:
    for item in content_type.split(";")[1:]:
        key, _, value = item.strip().partition("=")
        if key.lower() == "boundary" and value:
            return value.strip('"').encode("latin-1")
    raise HttpError(400, "multipart body without a boundary")


def parse_multipart(body: bytes, content_type: str) -> list[tuple[str, bytes]]:
    """``(filename, data)`` of every ``file`` part (other fields are ignored)."""
    delimiter = b"--" + _boundary(content_type)
    if not body.startswith(delimiter) and delimiter not in body:
        raise HttpError(400, "malformed multipart body")
    files: list[tuple[str, bytes]] = []
    for part in body.split(delimiter)[1:]:
        if part.startswith(b"--"):
            break  # the closing delimiter
        head, sep, data = part.partition(b"\r\n\r\n")
        if not sep:
            raise HttpError(400, "malformed multipart part")
        data = data.removesuffix(b"\r\n")
        disposition = ""
        for line in head.decode("utf-8", "replace").split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-disposition":
                disposition = value
        params = _disposition_params(disposition)
        if params.get("name") != "file":
            continue
        files.append((params.get("filename", ""), data))
    return files


def _disposition_params(value: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in value.split(";")[1:]:
        key, _, raw = item.strip().partition("=")
        raw = raw.strip()
        if raw.startswith('"') and raw.endswith('"') and len(raw) >= 2:
            raw = raw[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        out[key.lower()] = raw
    return out
