"""The daemon's ASGI application: Connect services, ``/files``, ``/health``, ``/init``, ``/envs``,
``/kept-files`` and ``/kept-files/thaw`` (``services.envd.archive``),
``/metrics`` and ``/logs`` (``services.envd.telemetry``), ``/activity`` and ``/keepalive``
(``services.envd.activity``).

Why connectrpc's own ASGI applications: they implement the Connect protocol (unary, server and
client streams, envelopes, error bodies, size limits) exactly as the SDK's connectrpc client
expects; this module only routes, checks ``X-Access-Token`` and serves envd's plain HTTP API.
Connect-Timeout-Ms is not enforced by connectrpc's server; the Start handler reads it through
``ctx.timeout_ms()`` and turns it into the process deadline, as real envd does.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from services.envd.activity import Activity
from services.envd.archive import KeptFilesApi
from services.envd.files_http import (
    FilesApi,
    Receive,
    Scope,
    Send,
    header,
    query,
    send_error,
    send_json,
)
from services.envd.holding import (
    HELD_MESSAGE,
    HoldInterceptor,
    WritesInFlight,
    allowed_while_held,
)
from services.envd.processes import ProcessTable
from services.envd.signing import signature_problem
from services.envd.startup import Readiness
from services.envd.telemetry import LogBuffer, Metrics
from services.envd.users import Users
from services.envd.version import ENVD_VERSION

if TYPE_CHECKING:
    from connectrpc.codec import Codec
    from protobuf import Message

    from services.envd.filesystem_service import FilesystemService

log = logging.getLogger("envd")

MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # one Connect message (SendInput data, a ListDir reply)
MAX_INIT_BYTES = 1024 * 1024
MAX_UNIX_SECONDS = 2**40  # far past any real timestamp, small enough for every clock type
MAX_LOG_LIMIT = 1000
MAX_LOG_SEARCH = 256


class BadQuery(ValueError):
    pass


def _int_param(params: dict[str, str], name: str, *, high: int) -> int | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 19 or int(raw) > high:
        raise BadQuery(f"{name} must be an integer from 0 to {high}")
    return int(raw)


class _StrictJSONCodec:
    """connectrpc's JSON codec, but a message that does not parse is INVALID_ARGUMENT (the
    stock codec lets the parse error escape, which the client would see as UNKNOWN)."""

    def __init__(self, inner: Codec[Message, Message]) -> None:
        self._inner = inner

    def name(self) -> str:
        return self._inner.name()

    def encode(self, message: Message) -> bytes:
        return self._inner.encode(message)

    def decode(self, data: bytes | bytearray, message_class: type[Message]) -> Message:
        try:
            return self._inner.decode(data, message_class)
        except Exception as exc:
            from connectrpc.code import Code
            from connectrpc.errors import ConnectError

            raise ConnectError(Code.INVALID_ARGUMENT, f"cannot decode request: {exc}") from exc


def _codecs() -> list[Codec[Message, Message]]:
    from connectrpc.codec import proto_binary_codec, proto_json_codec

    return [_StrictJSONCodec(proto_json_codec()), _StrictJSONCodec(proto_binary_codec())]


class _ConnectApps:
    """The Connect services: connectrpc and the protobuf runtime are most of the daemon's import
    time. ``serve`` builds them before answering ``/health``; in-process users (tests, tools) that
    never call the Connect API do not pay for them."""

    def __init__(
        self,
        table: ProcessTable,
        *,
        users: Users,
        held: Callable[[], bool],
        writes: WritesInFlight,
    ) -> None:
        from services.envd.filesystem_service import FilesystemService
        from services.envd.gen.filesystem.filesystem_connect import FilesystemASGIApplication
        from services.envd.gen.process.process_connect import ProcessASGIApplication
        from services.envd.process_service import ProcessService

        self.filesystem: FilesystemService = FilesystemService(users=users)
        holding = (HoldInterceptor(held, writes),)  # first: it refuses before a body is read
        self.process = ProcessASGIApplication(
            ProcessService(table, users),
            interceptors=holding,
            read_max_bytes=MAX_MESSAGE_BYTES,
            compressions=(),
            codecs=_codecs(),
        )
        self.files = FilesystemASGIApplication(
            self.filesystem,
            interceptors=holding,
            read_max_bytes=MAX_MESSAGE_BYTES,
            compressions=(),
            codecs=_codecs(),
        )


class DaemonState:
    """What /init can change after start: env vars, access token, default workdir."""

    def __init__(self, *, root: str, access_token: str | None) -> None:
        self.root = root
        self.access_token = access_token or None
        self.env_vars: dict[str, str] = {}
        self.default_workdir: str | None = None
        # Where the daemon started: a warm pod's root can change under it at claim (its
        # directory then still points into the old root), and /init enters it again by path.
        self.start_cwd = os.getcwd()

    def base_env(self) -> dict[str, str]:
        return {**os.environ, **self.env_vars}

    def default_cwd(self) -> str | None:
        """``/init``'s default workdir; None: the user's home."""
        return self.default_workdir


class EnvdApp:
    def __init__(self, *, root: str, access_token: str | None, kept_root: str = "/") -> None:
        self.state = DaemonState(root=root, access_token=access_token)
        self.activity = Activity()
        self.table = ProcessTable(
            base_env=self.state.base_env,
            default_cwd=self.state.default_cwd,
            root=root,
            on_output=self.activity.saw_output,
        )
        self._root = root
        self.users = Users(fallback_home=root)
        self._connect: _ConnectApps | None = None
        self._files = FilesApi(users=self.users)
        self.writes = WritesInFlight()  # what an export with a hold waits for
        self.kept_files = KeptFilesApi(
            kept_root=kept_root, user=lambda: self.users.resolve(None), writes=self.writes
        )
        self.metrics = Metrics(root)
        self.logs = LogBuffer()
        self.ready: Readiness | None = None  # set: a ready command must succeed first

    @property
    def connect_apps(self) -> _ConnectApps:
        if self._connect is None:
            self._connect = _ConnectApps(
                self.table,
                users=self.users,
                held=lambda: self.kept_files.holding,
                writes=self.writes,
            )
        return self._connect

    @property
    def filesystem(self) -> FilesystemService:
        return self.connect_apps.filesystem

    def begin_shutdown(self) -> None:
        """The daemon was told to stop (its pod is stopping)."""
        self.table.begin_shutdown()
        # Held for a pause: they die stopped, never to write again (a process in a session of
        # its own outlives the table's process groups). Now, not in close(): uvicorn ends a
        # SIGTERM by raising it again, so close() may never run.
        self.kept_files.freezer.kill()

    def close(self) -> None:
        self.kept_files.freezer.kill()
        self.table.shutdown()
        if self._connect is not None:
            self._connect.filesystem.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # no lifespan or websockets here
        path: str = scope["path"]
        try:
            if path == "/health":
                if self.ready is not None and not self.ready.done.is_set():
                    # A built template's ready command has not succeeded yet (startup.py): a
                    # distinct code, so the runtime can fail the create with the reason.
                    await send_json(send, 503, {"code": "not_ready", "message": self.ready.last})
                    return
                await send({"type": "http.response.start", "status": 204, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
            if path == "/keepalive" and scope["method"] == "POST":
                # No token: it is for the sandbox's own processes, which may keep their sandbox
                # busy anyway (the template's policy decides whether it counts, and how long).
                self.activity.kept_alive()
                await send({"type": "http.response.start", "status": 204, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
            refusal = self._refusal(scope)
            if refusal is not None:
                await send_json(send, 401, refusal)
                return
            connect = path.startswith(("/process.Process/", "/filesystem.Filesystem/"))
            if not connect and not allowed_while_held(scope["method"], path):
                # The Connect services refuse and count in their own interceptor.
                if self.kept_files.holding:
                    await send_error(send, 409, HELD_MESSAGE)
                    return
                async with self.writes.tracking():
                    await self._route(scope, receive, send, path)
                return
            await self._route(scope, receive, send, path)
        except Exception:
            log.exception("unhandled error on %s", path)
            raise

    async def _route(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        if path.startswith("/process.Process/"):
            if path == "/process.Process/Start":  # kept files go in before any process
                self.kept_files.close_imports("a process was started")
            await self.connect_apps.process(scope, receive, send)
        elif path.startswith("/filesystem.Filesystem/"):
            await self.connect_apps.files(scope, receive, send)
        elif path == "/files":
            await self._files(scope, receive, send)
        elif path in ("/kept-files", "/kept-files/thaw"):
            await self.kept_files(scope, receive, send)
        elif path == "/init" and scope["method"] == "POST":
            await self._init(receive, send)
        elif path == "/envs" and scope["method"] == "GET":
            await send_json(send, 200, self.state.env_vars)
        elif path == "/version":
            await send_json(send, 200, {"version": ENVD_VERSION})
        elif path == "/metrics" and scope["method"] == "GET":
            await self._metrics(scope, send)
        elif path == "/logs" and scope["method"] == "GET":
            await self._logs(scope, send)
        elif path == "/activity" and scope["method"] == "GET":
            await send_json(send, 200, self.activity.report())
        else:
            await send_error(send, 404, f"no route for {scope['method']} {path}")

    def _refusal(self, scope: Scope) -> dict[str, object] | None:
        """``None`` when the request may pass; else the 401 body. A signed ``/files`` URL is
        refused as envd refuses it (``{"code": 401, "message": ...}``, the SDK's users match on
        the message), anything else for the missing or wrong token."""
        token = self.state.access_token
        if token is None:
            return None
        given = header(scope, b"x-access-token")
        if given and hmac.compare_digest(given.encode(), token.encode()):
            return None
        if scope["path"] == "/files" and "signature" in query(scope):
            problem = signature_problem(query(scope), scope["method"], token, time.time())
            return None if problem is None else {"code": 401, "message": problem}
        return {
            "code": "unauthenticated",
            "message": "invalid or missing access token (X-Access-Token)",
        }

    async def _metrics(self, scope: Scope, send: Send) -> None:
        params = query(scope)
        try:
            start = _int_param(params, "start", high=MAX_UNIX_SECONDS)
            end = _int_param(params, "end", high=MAX_UNIX_SECONDS)
        except BadQuery as exc:
            await send_error(send, 400, str(exc))
            return
        await send_json(send, 200, self.metrics.between(start, end))

    async def _logs(self, scope: Scope, send: Send) -> None:
        params = query(scope)
        try:
            cursor = _int_param(params, "cursor", high=MAX_UNIX_SECONDS * 1000)
            limit = _int_param(params, "limit", high=MAX_LOG_LIMIT)
            direction = params.get("direction") or "forward"
            level = params.get("level") or None
            search = params.get("search")
            if direction not in ("forward", "backward"):
                raise BadQuery("direction must be forward or backward")
            if level not in (None, "debug", "info", "warn", "error"):
                raise BadQuery("level must be debug, info, warn or error")
            if search is not None and len(search) > MAX_LOG_SEARCH:
                raise BadQuery(f"search must be at most {MAX_LOG_SEARCH} characters")
        except BadQuery as exc:
            await send_error(send, 400, str(exc))
            return
        entries = self.logs.query(
            cursor_ms=cursor,
            limit=MAX_LOG_LIMIT if limit is None else limit,
            backward=direction == "backward",
            level=level,
            search=search,
        )
        await send_json(send, 200, entries)

    async def _init(self, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > MAX_INIT_BYTES:
                await send_error(send, 413, "init body too large")
                return
            if not message.get("more_body", False):
                break
        try:
            data: Any = json.loads(body or b"{}")
            if not isinstance(data, dict):
                raise TypeError("not an object")
            env_vars = data.get("envVars") or {}
            if not isinstance(env_vars, dict):
                raise TypeError("envVars is not an object")
        except (ValueError, TypeError) as exc:
            await send_error(send, 400, f"invalid init body: {exc}")
            return
        self.state.env_vars.update({str(k): str(v) for k, v in env_vars.items()})
        if isinstance(data.get("accessToken"), str) and data["accessToken"]:
            self.state.access_token = data["accessToken"]
        if isinstance(data.get("defaultWorkdir"), str) and data["defaultWorkdir"]:
            self.state.default_workdir = data["defaultWorkdir"]
        with contextlib.suppress(OSError):
            os.chdir(self.state.start_cwd)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
