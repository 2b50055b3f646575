"""While a kept-files export holds the sandbox (``GET /kept-files?hold=``, ``services.envd
.archive``), the daemon refuses every request of its own API that changes the sandbox: a file
written, moved or removed after the export is lost when the pod stops, and a process started
then would run unfrozen. The one rule for what may still pass is here, used by the plain HTTP
routing (``services.envd.app``: 409 JSON) and by the Connect services (``HoldInterceptor``:
``failed_precondition``, which the E2B SDK raises as a ``SandboxException`` carrying the
message; ``unavailable`` would send it probing the sandbox's health and blaming a timeout).

An allow-list, not a list of writes: a route or method added later is refused while held until
someone decides it only reads. Paths are matched exactly, as the routing matches them (a
variant such as ``/files/`` or ``//files`` is refused here, and is a 404 anyway); a Connect
method is named by the method connectrpc dispatched, never by the raw path, so no spelling of
one reaches a handler unchecked.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from connectrpc.request import RequestContext

HELD_MESSAGE = "the sandbox is being paused: its files were exported and its processes are held"

# Plain HTTP: (method, path) that change nothing a pause would lose. POST /keepalive only
# marks activity; POST /kept-files/thaw ends the hold itself.
_HTTP_READS: frozenset[tuple[str, str]] = frozenset(
    {
        ("GET", "/health"),
        ("HEAD", "/health"),
        ("POST", "/keepalive"),
        ("GET", "/files"),
        ("GET", "/kept-files"),
        ("POST", "/kept-files/thaw"),
        ("GET", "/envs"),
        ("GET", "/version"),
        ("GET", "/metrics"),
        ("GET", "/logs"),
        ("GET", "/activity"),
    }
)

# Connect methods ("/<service>/<method>", any HTTP method: Connect's GET is for reads only)
# that read. Watchers only watch; Connect attaches to a running process's output.
_RPC_READS: frozenset[str] = frozenset(
    {
        "/filesystem.Filesystem/Stat",
        "/filesystem.Filesystem/ListDir",
        "/filesystem.Filesystem/WatchDir",
        "/filesystem.Filesystem/CreateWatcher",
        "/filesystem.Filesystem/GetWatcherEvents",
        "/filesystem.Filesystem/RemoveWatcher",
        "/process.Process/List",
        "/process.Process/Connect",
    }
)


# Writes that last as long as a process or its client wants (a Start's stream, stdin streamed
# in): an export cannot wait for them. A process started is stopped by the freeze like any.
_RPC_LONG_LIVED: frozenset[str] = frozenset(
    {"/process.Process/Start", "/process.Process/StreamInput"}
)


def allowed_while_held(method: str, path: str) -> bool:
    """Whether a request may pass while the sandbox is held: it only reads (or ends the hold)."""
    return path in _RPC_READS or (method, path) in _HTTP_READS


class WritesInFlight:
    """The writes admitted before a hold began and still running (an upload streaming in): an
    export with a hold waits for them, else it would tar a half-written file and the rest,
    answered 200 to its client, would be lost with the pod."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def count(self) -> int:
        return self._count

    def begin(self) -> None:
        self._count += 1
        self._idle.clear()

    def end(self) -> None:
        self._count -= 1
        if self._count == 0:
            self._idle.set()

    @contextlib.asynccontextmanager
    async def tracking(self) -> AsyncIterator[None]:
        self.begin()
        try:
            yield
        finally:
            self.end()

    async def drained(self, within: float) -> bool:
        """Whether every write running now has ended within ``within`` seconds."""
        try:
            await asyncio.wait_for(self._idle.wait(), within)
        except TimeoutError:
            return False
        return True


class HoldInterceptor:
    """A connectrpc metadata interceptor: refuses a Connect method that changes the sandbox
    while it is held, before its request body is read; counts a short one admitted as a write
    in flight until it ends."""

    def __init__(self, held: Callable[[], bool], writes: WritesInFlight) -> None:
        self._held = held
        self._writes = writes

    async def on_start(self, ctx: RequestContext[object, object]) -> bool:
        info = ctx.method
        path = f"/{info.service_name}/{info.name}"
        if allowed_while_held(ctx.http_method, path):
            return False
        if self._held():
            from connectrpc.code import Code
            from connectrpc.errors import ConnectError

            raise ConnectError(Code.FAILED_PRECONDITION, HELD_MESSAGE)
        if path in _RPC_LONG_LIVED:
            return False
        self._writes.begin()
        return True

    async def on_end(
        self, token: bool, ctx: RequestContext[object, object], error: Exception | None, /
    ) -> None:
        if token:
            self._writes.end()
