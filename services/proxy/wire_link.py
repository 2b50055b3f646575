"""The proxy's link to ``torpor-wire``, its compiled data path (``services/proxy/wire``).

Why: the Python relay costs ~2x a C proxy's CPU per exchange, and at concurrency 1 every
microsecond of it is on the request's path (issue 20: 0.8 of direct throughput, a C L7 proxy
0.96). What stays here is every decision: the first exchange of a client connection is served
by the relay (routing, the token, waking a paused sandbox, limits, refusals). When it ends with
the connection kept alive and idle, and was authorised by the sandbox's own access token, the
connection's descriptor goes to ``torpor-wire`` with what was decided. It serves the next
requests while each one names the same sandbox port the same way with the same token and is
plain (no upgrade, no chunked or large body, a head that arrives whole); anything else comes
back here unanswered with the bytes read so far, and so does every connection of a sandbox
whose record changes (``forget``). A refused upstream connection comes back too (the boot-grace
retry is here).

What the link keeps: a handed connection still counts for its client (``max_connections_per_
client``) and against ``max_connections`` until it comes back or closes. Each of its exchanges
is one at a time, so the per-client request limit (which is at least the connection limit)
holds. The sandbox port's exchange limit is applied by each data path to its own exchanges.
Activity (the sandbox's timeout) and the proxied-request metrics arrive in batches every
200 ms.

Control socket: SOCK_SEQPACKET, one JSON object per packet, descriptors as SCM_RIGHTS.
"""

from __future__ import annotations

import array
import asyncio
import base64
import contextlib
import hashlib
import itertools
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import structlog

from services.proxy.forwarding import HOP_BY_HOP, PRIVATE
from services.proxy.upstream import IDLE_EXPIRY, MAX_RESPONSE_HEAD, MAX_RESPONSE_HEADERS

if TYPE_CHECKING:
    from pathlib import Path

    from shared.web.limits import HttpLimits

log = structlog.get_logger()

_MAX_PACKET = 1 << 20
# How long the relay waits for a body that follows its head before handing the connection
# back (the relay's own body timeouts then apply).
BODY_GRACE = 0.5


class Adoptable:
    """What the relay tells the link about a connection it hands over."""

    __slots__ = (
        "api_keys",
        "client",
        "daemon",
        "port",
        "route",
        "routing",
        "sandbox",
        "token",
        "upstream",
    )

    def __init__(
        self,
        *,
        client: str,
        sandbox: str,
        port: int,
        upstream: str,
        routing: tuple[bytes | None, bytes | None, bytes | None],
        token: str,
        api_keys: bool,
        daemon: bool,
        route: object,
    ) -> None:
        self.client = client
        self.sandbox = sandbox
        self.port = port
        self.upstream = upstream
        self.routing = routing
        self.token = token
        self.api_keys = api_keys
        self.daemon = daemon
        self.route = route  # what of the record the decision rests on (``forget_unless``)


class WireLink:
    """One ``torpor-wire`` process and the connections it holds."""

    def __init__(
        self,
        binary: Path,
        *,
        limits: HttpLimits,
        keep_alive: float,
        max_body: int,
        upstream_limit: int,
        on_return: Callable[[socket.socket, bytes, str], None],
        on_closed: Callable[[str], None],
        on_report: Callable[[list[str], list[float], int], None],
    ) -> None:
        self._binary = binary
        self._limits = limits
        self._keep_alive = keep_alive
        self._max_body = max_body
        self._upstream_limit = upstream_limit
        self._on_return = on_return
        self._on_closed = on_closed
        self._on_report = on_report
        self._ids = itertools.count(1)
        self._held: dict[int, tuple[str, str]] = {}  # id -> (client, sandbox)
        self._sandboxes: dict[str, int] = {}  # sandbox -> connections held
        self._routes: dict[str, object] = {}  # sandbox -> its route when last handed over
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.lost_at = 0.0  # time.monotonic() of the process's loss
        self.adoptions = 0  # connections handed over, ever

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def running(self) -> bool:
        return self._sock is not None

    def start(self, default_headers: list[tuple[bytes, bytes]]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for s in (ours, theirs):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * _MAX_PACKET)
        try:
            self._proc = subprocess.Popen(
                [str(self._binary), str(theirs.fileno())], pass_fds=(theirs.fileno(),)
            )
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        self._send(
            {
                "op": "config",
                "config": {
                    "status_lines": {
                        str(s.value): f"HTTP/1.1 {s.value} {s.phrase}\r\n" for s in HTTPStatus
                    },
                    "default_headers": [
                        [k.decode("latin-1"), v.decode("latin-1")]
                        for k, v in default_headers
                        if k.lower() != b"date"
                    ],
                    "date": any(k.lower() == b"date" for k, _ in default_headers),
                    "hop_by_hop": sorted(h.decode() for h in HOP_BY_HOP),
                    "not_forwarded": sorted(h.decode() for h in HOP_BY_HOP | PRIVATE | {b"expect"}),
                    "max_head": self._limits.max_header_bytes,
                    "max_headers": self._limits.max_headers,
                    "max_body": self._max_body,
                    "keep_alive": self._keep_alive,
                    "body_grace": BODY_GRACE,
                    "upstream_limit": self._upstream_limit,
                    "idle_expiry": IDLE_EXPIRY,
                    "max_response_head": MAX_RESPONSE_HEAD,
                    "max_response_headers": MAX_RESPONSE_HEADERS,
                },
            }
        )
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(ours.fileno(), self._readable)
        log.info("proxy_wire_started", binary=str(self._binary), pid=self._proc.pid)

    async def stop(self) -> None:
        """Closing the control socket tells the process to finish: idle connections close,
        exchanges under way end (at most 10 s)."""
        sock, self._sock = self._sock, None
        if sock is not None and self._loop is not None:
            self._loop.remove_reader(sock.fileno())
            sock.close()
        proc = self._proc
        if proc is not None:
            for _ in range(120):
                if proc.poll() is not None:
                    break
                await asyncio.sleep(0.1)
            else:
                proc.kill()
                proc.wait()
        self._release_all()

    # ---- handing a connection over ----------------------------------------------------------

    def adopt(self, transport: asyncio.Transport, what: Adoptable) -> bool:
        """Hand an idle kept-alive client connection over; False: it stays here."""
        if self._sock is None or transport.get_write_buffer_size():
            return False
        raw = transport.get_extra_info("socket")
        if raw is None:
            return False
        conn_id = next(self._ids)
        message = {
            "op": "adopt",
            "id": conn_id,
            "client": what.client,
            "sandbox": what.sandbox,
            "port": what.port,
            "upstream": what.upstream,
            "routing": [None if r is None else base64.b64encode(r).decode() for r in what.routing],
            "token": what.token,
            "api_keys": what.api_keys,
            "daemon": what.daemon,
        }
        fd = os.dup(raw.fileno())
        try:
            if not self._send(message, fd):
                return False
        finally:
            os.close(fd)
        self._held[conn_id] = (what.client, what.sandbox)
        self.adoptions += 1
        self._sandboxes[what.sandbox] = self._sandboxes.get(what.sandbox, 0) + 1
        if self._routes.get(what.sandbox, what.route) != what.route:
            self._send({"op": "forget", "sandbox": what.sandbox})  # older hand-overs
        self._routes[what.sandbox] = what.route
        return True

    def forget_unless(self, sandbox_id: str, route: object) -> None:
        """The sandbox's record changed: unless what the hand-overs rested on is the same
        (``route``; None: no longer routable), its connections come back at their next
        request. A touch or a metadata change leaves them where they are."""
        if sandbox_id in self._sandboxes and (
            route is None or self._routes.get(sandbox_id) != route
        ):
            self._routes.pop(sandbox_id, None)
            self._send({"op": "forget", "sandbox": sandbox_id})

    def forget_all(self) -> None:
        self._routes.clear()
        for sandbox_id in list(self._sandboxes):
            self._send({"op": "forget", "sandbox": sandbox_id})

    @staticmethod
    def token_digest(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    # ---- the control socket -----------------------------------------------------------------

    def _send(self, message: dict[str, Any], fd: int | None = None) -> bool:
        sock = self._sock
        if sock is None:
            return False
        data = json.dumps(message).encode()
        ancillary = []
        if fd is not None:
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
        try:
            sock.sendmsg([data], ancillary)
        except OSError as e:  # full (the process is stuck) or gone: serve it here instead
            log.warning("proxy_wire_send_failed", error=repr(e))
            return False
        return True

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        while True:
            try:
                data, ancdata, _flags, _addr = sock.recvmsg(
                    _MAX_PACKET, socket.CMSG_SPACE(4 * array.array("i").itemsize)
                )
            except BlockingIOError:
                return
            except OSError as e:
                self._lost(repr(e))
                return
            if not data:
                self._lost("the process closed its control socket")
                return
            fds: list[int] = []
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    usable = len(payload) - len(payload) % 4
                    fds += array.array("i", payload[:usable]).tolist()
            try:
                self._handle(json.loads(data), fds)
            except Exception as e:
                log.warning("proxy_wire_message_failed", error=repr(e))
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)

    def _handle(self, message: dict[str, Any], fds: list[int]) -> None:
        op = message.get("op")
        if op == "seen":
            self._on_report(
                list(message.get("sandboxes") or []),
                list(message.get("latencies") or []),
                int(message.get("refused") or 0),
            )
            return
        conn_id = int(message.get("id", 0))
        held = self._held.pop(conn_id, None)
        if held is not None:
            self._drop_sandbox(held[1])
        if op == "return" and len(fds) == 1 and held is not None:
            data = base64.b64decode(message.get("data") or "")
            self._on_closed(held[0])
            self._on_return(socket.socket(fileno=fds[0]), data, held[0])
            return
        for fd in fds:
            os.close(fd)
        if held is not None:
            self._on_closed(held[0])

    def _drop_sandbox(self, sandbox_id: str) -> None:
        left = self._sandboxes.get(sandbox_id, 0) - 1
        if left > 0:
            self._sandboxes[sandbox_id] = left
        else:
            self._sandboxes.pop(sandbox_id, None)
            self._routes.pop(sandbox_id, None)

    def _lost(self, why: str) -> None:
        """The process is gone: its connections with it (their clients see them close)."""
        log.warning("proxy_wire_lost", reason=why, connections=len(self._held))
        self.lost_at = time.monotonic()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        if self._proc is not None:
            self._proc.wait()
        sock, self._sock = self._sock, None
        if sock is not None and self._loop is not None:
            self._loop.remove_reader(sock.fileno())
            sock.close()
        self._release_all()

    def _release_all(self) -> None:
        held, self._held = self._held, {}
        self._sandboxes.clear()
        self._routes.clear()
        for client, _ in held.values():
            self._on_closed(client)
