"""``process.Process`` over Connect: protobuf in, ``ProcessTable`` calls, protobuf out."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal, cast

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from protobuf import Oneof

from services.envd.gen.process import process_pb as pb
from services.envd.gen.process.process_connect import Process as ProcessProtocol
from services.envd.processes import Exit, Output, Process, ProcessError, ProcessSpec, ProcessTable
from services.envd.users import Identity, UnknownUser, Users, basic_auth_user

# Real envd's default when the client sends no Keepalive-Ping-Interval.
DEFAULT_KEEPALIVE_SECONDS = 90.0
MIN_KEEPALIVE_SECONDS = 0.05

_CODES = {
    "not_found": Code.NOT_FOUND,
    "invalid_argument": Code.INVALID_ARGUMENT,
    "failed_precondition": Code.FAILED_PRECONDITION,
    "resource_exhausted": Code.RESOURCE_EXHAUSTED,
    "deadline_exceeded": Code.DEADLINE_EXCEEDED,
    "unavailable": Code.UNAVAILABLE,
    "internal": Code.INTERNAL,
}
_SIGNALS = {pb.Signal.SIGKILL: 9, pb.Signal.SIGTERM: 15}


@contextlib.contextmanager
def connect_errors() -> Iterator[None]:
    try:
        yield
    except ProcessError as exc:
        raise ConnectError(_CODES.get(exc.kind, Code.INTERNAL), str(exc)) from exc


def request_identity(users: Users, ctx: RequestContext[Any, Any]) -> Identity:
    """The user a Connect request acts as: Basic auth's user name, else the default user."""
    try:
        return users.resolve(basic_auth_user(ctx.request_headers.get("authorization")))
    except UnknownUser as exc:
        raise ConnectError(Code.UNAUTHENTICATED, str(exc)) from exc


def keepalive_interval(ctx: RequestContext[object, object]) -> float:
    headers = ctx.request_headers
    raw = headers.get("keepalive-ping-interval") or headers.get("x-keepalive-interval")
    try:
        value = float(raw) if raw else DEFAULT_KEEPALIVE_SECONDS
    except ValueError:
        value = DEFAULT_KEEPALIVE_SECONDS
    return max(value, MIN_KEEPALIVE_SECONDS)


_Event = (
    Oneof[Literal["start"], pb.ProcessEvent.StartEvent]
    | Oneof[Literal["data"], pb.ProcessEvent.DataEvent]
    | Oneof[Literal["end"], pb.ProcessEvent.EndEvent]
    | Oneof[Literal["keepalive"], pb.ProcessEvent.KeepAlive]
)
_Output = (
    Oneof[Literal["stdout"], bytes] | Oneof[Literal["stderr"], bytes] | Oneof[Literal["pty"], bytes]
)


def _output(item: Output) -> _Output:
    # mypy cannot narrow Oneof's field name to a Literal from context; the casts only say so.
    return cast("_Output", Oneof(item.stream, item.data))


def _event(item: Output | Exit | None) -> pb.ProcessEvent:
    event: _Event
    if item is None:
        event = cast("_Event", Oneof("keepalive", pb.ProcessEvent.KeepAlive()))
    elif isinstance(item, Output):
        event = cast("_Event", Oneof("data", pb.ProcessEvent.DataEvent(output=_output(item))))
    else:
        end = pb.ProcessEvent.EndEvent(
            exit_code=item.exit_code, exited=item.exited, status=item.status
        )
        if item.error:
            end.error = item.error
        event = cast("_Event", Oneof("end", end))
    return pb.ProcessEvent(event=event)


def _start_event(pid: int) -> pb.ProcessEvent:
    return pb.ProcessEvent(
        event=cast("_Event", Oneof("start", pb.ProcessEvent.StartEvent(pid=pid)))
    )


def _select(table: ProcessTable, selector: pb.ProcessSelector | None) -> Process:
    match selector.selector if selector is not None else None:
        case Oneof(field="pid", value=pid):
            return table.get(pid=int(pid))
        case Oneof(field="tag", value=tag):
            return table.get(tag=str(tag))
    raise ProcessError("invalid_argument", "a process selector (pid or tag) is required")


class ProcessService(ProcessProtocol):
    def __init__(self, table: ProcessTable, users: Users) -> None:
        self._table = table
        self._users = users

    async def list(
        self, request: pb.ListRequest, ctx: RequestContext[pb.ListRequest, pb.ListResponse], /
    ) -> pb.ListResponse:
        infos = []
        for proc in self._table.list():
            config = pb.ProcessConfig(
                cmd=proc.spec.cmd, args=list(proc.spec.args), envs=dict(proc.spec.envs)
            )
            if proc.spec.cwd:
                config.cwd = proc.spec.cwd
            info = pb.ProcessInfo(config=config, pid=proc.pid)
            if proc.spec.tag:
                info.tag = proc.spec.tag
            infos.append(info)
        return pb.ListResponse(processes=infos)

    async def start(
        self, request: pb.StartRequest, ctx: RequestContext[pb.StartRequest, pb.StartResponse], /
    ) -> AsyncIterator[pb.StartResponse]:
        config = request.process
        if config is None:
            raise ConnectError(Code.INVALID_ARGUMENT, "process config is required")
        pty_size: tuple[int, int] | None = None
        if request.pty is not None:
            size = request.pty.size
            pty_size = (size.cols or 80, size.rows or 24) if size is not None else (80, 24)
        spec = ProcessSpec(
            cmd=config.cmd,
            args=list(config.args),
            envs=dict(config.envs),
            cwd=config.cwd or None,
            tag=request.tag or None,
            stdin=bool(request.stdin),
            pty_size=pty_size,
            user=request_identity(self._users, ctx),
        )
        timeout_ms = ctx.timeout_ms
        with connect_errors():
            # Connect-Timeout-Ms bounds the process's life, not just this stream (as real envd).
            proc, sub = self._table.start(
                spec, timeout=timeout_ms / 1000.0 if timeout_ms is not None else None
            )
        interval = keepalive_interval(ctx)  # type: ignore[arg-type]
        try:
            yield pb.StartResponse(event=_start_event(proc.pid))
            with connect_errors():
                async for item in proc.events(sub, interval):
                    yield pb.StartResponse(event=_event(item))
        finally:
            # The client went away (or the process ended): the process itself keeps running.
            proc.unsubscribe(sub)

    async def connect(
        self,
        request: pb.ConnectRequest,
        ctx: RequestContext[pb.ConnectRequest, pb.ConnectResponse],
        /,
    ) -> AsyncIterator[pb.ConnectResponse]:
        with connect_errors():
            proc = _select(self._table, request.process)
        sub = proc.subscribe()
        interval = keepalive_interval(ctx)  # type: ignore[arg-type]
        try:
            yield pb.ConnectResponse(event=_start_event(proc.pid))
            with connect_errors():
                async for item in proc.events(sub, interval):
                    yield pb.ConnectResponse(event=_event(item))
        finally:
            proc.unsubscribe(sub)

    async def update(
        self, request: pb.UpdateRequest, ctx: RequestContext[pb.UpdateRequest, pb.UpdateResponse], /
    ) -> pb.UpdateResponse:
        with connect_errors():
            proc = _select(self._table, request.process)
            if request.pty is not None and request.pty.size is not None:
                self._table.resize(proc, request.pty.size.cols, request.pty.size.rows)
        return pb.UpdateResponse()

    async def stream_input(
        self,
        request: AsyncIterator[pb.StreamInputRequest],
        ctx: RequestContext[pb.StreamInputRequest, pb.StreamInputResponse],
        /,
    ) -> pb.StreamInputResponse:
        proc: Process | None = None
        with connect_errors():
            async for message in request:
                match message.event:
                    case Oneof(field="start", value=pb.StreamInputRequest.StartEvent() as start):
                        proc = _select(self._table, start.process)
                    case Oneof(field="data", value=pb.StreamInputRequest.DataEvent() as data):
                        if proc is None:
                            raise ConnectError(
                                Code.FAILED_PRECONDITION, "the first message must be a start event"
                            )
                        await self._write(proc, data.input)
        return pb.StreamInputResponse()

    async def send_input(
        self,
        request: pb.SendInputRequest,
        ctx: RequestContext[pb.SendInputRequest, pb.SendInputResponse],
        /,
    ) -> pb.SendInputResponse:
        with connect_errors():
            proc = _select(self._table, request.process)
            await self._write(proc, request.input)
        return pb.SendInputResponse()

    async def _write(self, proc: Process, value: pb.ProcessInput | None) -> None:
        match value.input if value is not None else None:
            case Oneof(field="stdin", value=data):
                await self._table.send_input(proc, bytes(data), pty=False)
            case Oneof(field="pty", value=data):
                await self._table.send_input(proc, bytes(data), pty=True)

    async def send_signal(
        self,
        request: pb.SendSignalRequest,
        ctx: RequestContext[pb.SendSignalRequest, pb.SendSignalResponse],
        /,
    ) -> pb.SendSignalResponse:
        with connect_errors():
            proc = _select(self._table, request.process)
            sig = _SIGNALS.get(request.signal)
            if sig is None:
                raise ConnectError(Code.INVALID_ARGUMENT, f"unsupported signal {request.signal}")
            self._table.signal(proc, sig)
        if sig == 9:
            await self._table.reaped(proc, within=1.0)
        return pb.SendSignalResponse()

    async def close_stdin(
        self,
        request: pb.CloseStdinRequest,
        ctx: RequestContext[pb.CloseStdinRequest, pb.CloseStdinResponse],
        /,
    ) -> pb.CloseStdinResponse:
        with connect_errors():
            self._table.close_stdin(_select(self._table, request.process))
        return pb.CloseStdinResponse()
