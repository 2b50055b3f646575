"""``filesystem.Filesystem`` over Connect: stat, list, mkdir, move, remove and watching.

envd 0.6.x behaviour: entries carry their ``user.e2b.*`` metadata (0.6.2); watch events carry
the entry when asked (0.6.3); watching a directory on a network filesystem needs
``allow_network_mounts`` (0.6.4); removing a path that does not exist succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import pwd
import shutil
import stat
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Literal, cast

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from protobuf import Oneof
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp

from services.envd import metadata as file_metadata
from services.envd.gen.filesystem import filesystem_pb as pb
from services.envd.gen.filesystem.filesystem_connect import Filesystem as FilesystemProtocol
from services.envd.inotify import Watcher, is_network_filesystem
from services.envd.paths import BadPath, resolve
from services.envd.process_service import keepalive_interval, request_identity
from services.envd.users import Identity, Users

_EVENT_TYPES = {
    "create": pb.EventType.CREATE,
    "write": pb.EventType.WRITE,
    "remove": pb.EventType.REMOVE,
    "rename": pb.EventType.RENAME,
    "chmod": pb.EventType.CHMOD,
}
_WatchEvent = (
    Oneof[Literal["start"], pb.WatchDirResponse.StartEvent]
    | Oneof[Literal["filesystem"], pb.FilesystemEvent]
    | Oneof[Literal["keepalive"], pb.WatchDirResponse.KeepAlive]
)
MAX_WATCHERS = 256
MAX_BUFFERED_EVENTS = 10_000


@contextlib.contextmanager
def fs_errors(path: str) -> Iterator[None]:
    """OS errors to the Connect codes the SDK maps (NOT_FOUND -> FileNotFoundException, ...)."""
    try:
        yield
    except BadPath as exc:
        raise ConnectError(Code.INVALID_ARGUMENT, str(exc)) from exc
    except FileNotFoundError as exc:
        raise ConnectError(Code.NOT_FOUND, f"path {path!r} not found") from exc
    except FileExistsError as exc:
        raise ConnectError(Code.ALREADY_EXISTS, f"path {path!r} already exists") from exc
    except NotADirectoryError as exc:
        raise ConnectError(Code.INVALID_ARGUMENT, f"path {path!r} is not a directory") from exc
    except PermissionError as exc:
        raise ConnectError(Code.PERMISSION_DENIED, f"permission denied: {path!r}") from exc
    except OSError as exc:
        raise ConnectError(Code.INTERNAL, f"{path!r}: {exc.strerror or exc}") from exc


def _name_of(lookup: Callable[[int], object], ident: int) -> str:
    try:
        return str(lookup(ident)[0])  # type: ignore[index]
    except (KeyError, IndexError):
        return str(ident)


def entry_info(path: str) -> pb.EntryInfo:
    st = os.lstat(path)
    is_link = stat.S_ISLNK(st.st_mode)
    target_st = st
    target: str | None = None
    if is_link:
        target = os.path.realpath(path)
        with contextlib.suppress(OSError):
            target_st = os.stat(path)
    if stat.S_ISDIR(target_st.st_mode):
        kind = pb.FileType.DIRECTORY
    elif stat.S_ISREG(target_st.st_mode):
        kind = pb.FileType.FILE
    else:
        kind = pb.FileType.UNSPECIFIED
    info = pb.EntryInfo(
        name=os.path.basename(path) or path,
        type=kind,
        path=path,
        size=st.st_size,
        mode=stat.S_IMODE(st.st_mode),
        permissions=stat.filemode(st.st_mode),
        owner=_name_of(pwd.getpwuid, st.st_uid),
        group=_name_of(grp.getgrgid, st.st_gid),
        modified_time=Timestamp(seconds=int(st.st_mtime), nanos=st.st_mtime_ns % 1_000_000_000),
        is_symlink=is_link,
    )
    if target is not None:
        info.symlink_target = target
    if meta := file_metadata.read(path):
        info.metadata = meta
    return info


def _walk(path: str, depth: int) -> list[pb.EntryInfo]:
    out: list[pb.EntryInfo] = []
    with os.scandir(path) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        with contextlib.suppress(FileNotFoundError):
            out.append(entry_info(entry.path))
            if depth > 1 and entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    out.extend(_walk(entry.path, depth - 1))
    return out


class _Buffered:
    """A watcher whose events are collected for GetWatcherEvents."""

    def __init__(self, watcher: Watcher | None = None) -> None:
        self.watcher = watcher
        self.events: list[pb.FilesystemEvent] = []


def _fs_event(kind: str, name: str, full: str, include_entry: bool) -> pb.FilesystemEvent:
    event = pb.FilesystemEvent(name=name, type=_EVENT_TYPES[kind])
    if include_entry and kind in ("create", "write", "chmod"):
        with contextlib.suppress(OSError):
            event.entry = entry_info(full)
    return event


class FilesystemService(FilesystemProtocol):
    def __init__(self, *, users: Users) -> None:
        self._users = users
        self._watchers: dict[str, _Buffered] = {}

    def _who(self, ctx: RequestContext[Any, Any]) -> Identity:
        return request_identity(self._users, ctx)

    def _path(self, path: str, ctx: RequestContext[Any, Any]) -> str:
        """``path`` for the request's user: relative to (and ``~`` as) its home."""
        home = self._who(ctx).home
        return resolve(path, home, home)

    async def stat(
        self, request: pb.StatRequest, ctx: RequestContext[pb.StatRequest, pb.StatResponse], /
    ) -> pb.StatResponse:
        with fs_errors(request.path):
            return pb.StatResponse(entry=entry_info(self._path(request.path, ctx)))

    async def make_dir(
        self,
        request: pb.MakeDirRequest,
        ctx: RequestContext[pb.MakeDirRequest, pb.MakeDirResponse],
        /,
    ) -> pb.MakeDirResponse:
        with fs_errors(request.path):
            path = self._path(request.path, ctx)
            if os.path.lexists(path):
                if os.path.isdir(path):
                    raise FileExistsError(path)
                raise ConnectError(Code.INVALID_ARGUMENT, f"{request.path!r} is not a directory")
            self._who(ctx).own_new_dirs(path)
            return pb.MakeDirResponse(entry=entry_info(path))

    async def move(
        self, request: pb.MoveRequest, ctx: RequestContext[pb.MoveRequest, pb.MoveResponse], /
    ) -> pb.MoveResponse:
        with fs_errors(request.source):
            source = self._path(request.source, ctx)
            destination = self._path(request.destination, ctx)
            if not os.path.lexists(source):
                raise FileNotFoundError(source)
            self._who(ctx).own_new_dirs(os.path.dirname(destination) or "/")
            os.rename(source, destination)
            return pb.MoveResponse(entry=entry_info(destination))

    async def list_dir(
        self,
        request: pb.ListDirRequest,
        ctx: RequestContext[pb.ListDirRequest, pb.ListDirResponse],
        /,
    ) -> pb.ListDirResponse:
        with fs_errors(request.path):
            path = self._path(request.path, ctx)
            if not os.path.isdir(path):
                if not os.path.lexists(path):
                    raise FileNotFoundError(path)
                raise NotADirectoryError(path)
            depth = max(int(request.depth or 1), 1)
            return pb.ListDirResponse(entries=_walk(path, depth))

    async def remove(
        self, request: pb.RemoveRequest, ctx: RequestContext[pb.RemoveRequest, pb.RemoveResponse], /
    ) -> pb.RemoveResponse:
        with fs_errors(request.path):
            path = self._path(request.path, ctx)
            # A missing path is already removed: success, as envd (and ``rm -f``) answer.
            with contextlib.suppress(FileNotFoundError):
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
        return pb.RemoveResponse()

    def _open_watcher(
        self,
        path: str,
        recursive: bool,
        on_event: Callable[[str, str, str], None],
        *,
        allow_network_mounts: bool,
        ctx: RequestContext[Any, Any],
    ) -> Watcher:
        with fs_errors(path):
            resolved = self._path(path, ctx)
            if not os.path.isdir(resolved):
                if not os.path.lexists(resolved):
                    raise FileNotFoundError(resolved)
                raise NotADirectoryError(resolved)
            if not allow_network_mounts and is_network_filesystem(resolved):
                # inotify sees only this machine's changes there: say so instead of going quiet.
                raise ConnectError(
                    Code.FAILED_PRECONDITION,
                    f"{path!r} is on a network filesystem; watching it needs allow_network_mounts",
                )
            return Watcher(resolved, recursive=recursive, on_event=on_event)

    async def watch_dir(
        self,
        request: pb.WatchDirRequest,
        ctx: RequestContext[pb.WatchDirRequest, pb.WatchDirResponse],
        /,
    ) -> AsyncIterator[pb.WatchDirResponse]:
        queue: asyncio.Queue[pb.FilesystemEvent] = asyncio.Queue(MAX_BUFFERED_EVENTS)

        def on_event(kind: str, name: str, full: str) -> None:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(_fs_event(kind, name, full, request.include_entry))

        watcher = self._open_watcher(
            request.path,
            request.recursive,
            on_event,
            allow_network_mounts=request.allow_network_mounts,
            ctx=ctx,
        )
        interval = keepalive_interval(ctx)  # type: ignore[arg-type]
        try:
            # The casts only tell mypy the Oneof field names are Literals.
            message = cast("_WatchEvent", Oneof("start", pb.WatchDirResponse.StartEvent()))
            yield pb.WatchDirResponse(event=message)
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), interval)
                    message = cast("_WatchEvent", Oneof("filesystem", event))
                except TimeoutError:
                    message = cast(
                        "_WatchEvent", Oneof("keepalive", pb.WatchDirResponse.KeepAlive())
                    )
                yield pb.WatchDirResponse(event=message)
        finally:
            watcher.close()

    async def create_watcher(
        self,
        request: pb.CreateWatcherRequest,
        ctx: RequestContext[pb.CreateWatcherRequest, pb.CreateWatcherResponse],
        /,
    ) -> pb.CreateWatcherResponse:
        if len(self._watchers) >= MAX_WATCHERS:
            raise ConnectError(Code.RESOURCE_EXHAUSTED, f"at most {MAX_WATCHERS} watchers")
        buffered = _Buffered()

        def on_event(kind: str, name: str, full: str) -> None:
            if len(buffered.events) < MAX_BUFFERED_EVENTS:
                buffered.events.append(_fs_event(kind, name, full, request.include_entry))

        buffered.watcher = self._open_watcher(
            request.path,
            request.recursive,
            on_event,
            allow_network_mounts=request.allow_network_mounts,
            ctx=ctx,
        )
        watcher_id = uuid.uuid4().hex
        self._watchers[watcher_id] = buffered
        return pb.CreateWatcherResponse(watcher_id=watcher_id)

    async def get_watcher_events(
        self,
        request: pb.GetWatcherEventsRequest,
        ctx: RequestContext[pb.GetWatcherEventsRequest, pb.GetWatcherEventsResponse],
        /,
    ) -> pb.GetWatcherEventsResponse:
        buffered = self._watchers.get(request.watcher_id)
        if buffered is None:
            raise ConnectError(Code.NOT_FOUND, f"watcher {request.watcher_id!r} not found")
        if buffered.watcher is not None:
            # What the kernel has queued by now counts: a caller that wrote a file and then
            # asks gets that write's events, not a read-loop tick later.
            buffered.watcher.drain()
        events, buffered.events = buffered.events, []
        return pb.GetWatcherEventsResponse(events=events)

    async def remove_watcher(
        self,
        request: pb.RemoveWatcherRequest,
        ctx: RequestContext[pb.RemoveWatcherRequest, pb.RemoveWatcherResponse],
        /,
    ) -> pb.RemoveWatcherResponse:
        buffered = self._watchers.pop(request.watcher_id, None)
        if buffered is None:
            raise ConnectError(Code.NOT_FOUND, f"watcher {request.watcher_id!r} not found")
        if buffered.watcher is not None:
            buffered.watcher.close()
        return pb.RemoveWatcherResponse()

    def close(self) -> None:
        for buffered in self._watchers.values():
            if buffered.watcher is not None:
                buffered.watcher.close()
        self._watchers.clear()
