"""The process table: spawn, fan out output, feed input, signal, reap.

Wire-independent: the Connect service (``process_service``) translates to and from protobuf.

Why not ``asyncio.create_subprocess_exec``: its child watcher waits on each pid it started, while
this daemon must also reap orphans re-parented to it (it may run as a subreaper or PID 1 inside a
sandbox). One ``SIGCHLD`` handler calling ``waitpid(-1, WNOHANG)`` does both, and the two schemes
cannot be mixed without stealing each other's exit statuses. Output is read with
``loop.add_reader`` on non-blocking fds; nothing here starts a thread.

Every process gets its own session (``setsid``), so signals go to its whole process group: killing
``bash -l -c "python3 server.py"`` also kills ``server.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import signal
import struct
import subprocess
import termios
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import IO

from services.envd.users import Identity

log = logging.getLogger("envd.processes")

# A subscriber that falls this far behind is dropped (its stream ends with an error) instead of
# buffering without bound or stalling the process.
MAX_SUBSCRIBER_BACKLOG = 16 * 1024 * 1024
READ_CHUNK = 64 * 1024
# After the direct child exits, how long to wait for grandchildren still holding its output pipes
# before reporting the end event anyway.
OUTPUT_DRAIN_GRACE = 0.5

_GO_SIGNAL_NAMES: dict[int, str] = {
    signal.SIGHUP: "hangup",
    signal.SIGINT: "interrupt",
    signal.SIGQUIT: "quit",
    signal.SIGABRT: "aborted",
    signal.SIGKILL: "killed",
    signal.SIGSEGV: "segmentation fault",
    signal.SIGPIPE: "broken pipe",
    signal.SIGALRM: "alarm clock",
    signal.SIGTERM: "terminated",
    signal.SIGUSR1: "user defined signal 1",
    signal.SIGUSR2: "user defined signal 2",
}


class ProcessError(Exception):
    """A request about a process cannot be carried out; ``kind`` picks the Connect code."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # "not_found" | "invalid_argument" | "failed_precondition" | "internal"


@dataclass(frozen=True)
class ProcessSpec:
    cmd: str
    args: list[str]
    envs: dict[str, str]
    cwd: str | None  # as the client gave it (reported back by List)
    tag: str | None = None
    stdin: bool = False
    pty_size: tuple[int, int] | None = None  # (cols, rows)
    user: Identity | None = None  # who it runs as (None: as the daemon)


@dataclass(frozen=True)
class Output:
    stream: str  # "stdout" | "stderr" | "pty"
    data: bytes


@dataclass(frozen=True)
class Exit:
    exit_code: int
    exited: bool
    status: str
    error: str | None = None


def describe_wait_status(status: int) -> Exit:
    """Go's ``ProcessState`` view of a wait status, which is what real envd reports."""
    if os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        return Exit(exit_code=code, exited=True, status=f"exit status {code}")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = _GO_SIGNAL_NAMES.get(sig, f"signal {sig}")
        return Exit(exit_code=-1, exited=False, status=f"signal: {name}")
    return Exit(exit_code=-1, exited=False, status=f"unknown wait status {status}")


@dataclass(frozen=True)
class Broken:
    """A stream that must end with an error instead of the process's end: its deadline passed
    (``deadline_exceeded``, as envd's expired request context) or the daemon is stopping
    (``unavailable``: the sandbox is going away, so its streams break rather than end)."""

    kind: str
    message: str


class Subscriber:
    """One stream's view of a process: output and the end, in order."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Output | Exit | Broken | None] = asyncio.Queue()
        self._backlog = 0
        self.dropped = False

    def push(self, item: Output | Exit | Broken) -> None:
        if self.dropped:
            return
        if isinstance(item, Output):
            self._backlog += len(item.data)
            if self._backlog > MAX_SUBSCRIBER_BACKLOG:
                self.dropped = True
                self._queue.put_nowait(None)
                return
        self._queue.put_nowait(item)

    async def next(self, timeout: float | None) -> Output | Exit | Broken | None:
        """The next item; ``None`` means dropped. Raises ``TimeoutError`` after ``timeout``."""
        item = await asyncio.wait_for(self._queue.get(), timeout)
        if isinstance(item, Output):
            self._backlog -= len(item.data)
        return item


@dataclass(eq=False)
class Process:
    pid: int
    spec: ProcessSpec
    popen: subprocess.Popen[bytes]
    stdin_fd: int | None = None
    pty_fd: int | None = None
    output_fds: dict[int, str] = field(default_factory=dict)  # fd -> stream name
    pipes: dict[int, IO[bytes]] = field(default_factory=dict)  # fd -> its Popen pipe object
    subscribers: set[Subscriber] = field(default_factory=set)
    wait_status: int | None = None
    ended: bool = False
    deadline: asyncio.TimerHandle | None = None
    deadline_hit: bool = False
    grace: asyncio.TimerHandle | None = None

    def subscribe(self) -> Subscriber:
        sub = Subscriber()
        self.subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)

    async def events(
        self, sub: Subscriber, keepalive: float | None
    ) -> AsyncIterator[Output | Exit | None]:
        """Output and the end for ``sub``; ``None`` items are keepalive ticks."""
        try:
            while True:
                try:
                    item = await sub.next(keepalive)
                except TimeoutError:
                    yield None
                    continue
                if item is None:
                    raise ProcessError("resource_exhausted", "stream fell too far behind")
                if isinstance(item, Broken):
                    raise ProcessError(item.kind, item.message)
                yield item
                if isinstance(item, Exit):
                    return
        finally:
            self.unsubscribe(sub)


class ProcessTable:
    """Every live process this daemon started, in start order."""

    def __init__(
        self,
        *,
        base_env: Callable[[], dict[str, str]],
        default_cwd: Callable[[], str | None],
        root: str,
        on_output: Callable[[], None] | None = None,
    ) -> None:
        self._procs: dict[int, Process] = {}
        self._base_env = base_env
        self._default_cwd = default_cwd
        self._root = root
        self._on_output = on_output  # activity: a process wrote something
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watched: dict[int, Callable[[int], None]] = {}
        self.closing = False

    # --- lifecycle -------------------------------------------------------------------------

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_signal_handler(signal.SIGCHLD, self.reap)
        self.reap()  # children that exited before the handler existed

    def watch(self, pid: int, on_exit: Callable[[int], None]) -> None:
        """Call ``on_exit(wait status)`` when child ``pid`` (started by someone else in this
        daemon, right before: the reaper runs on the loop) is reaped."""
        self._watched[pid] = on_exit
        self.reap()

    def begin_shutdown(self) -> None:
        """The daemon was told to stop (its sandbox is being stopped): from now on no stream
        reports a process's end; every open stream breaks now."""
        self.closing = True
        broken = Broken("unavailable", "envd is stopping: the sandbox is being stopped")
        for proc in list(self._procs.values()):
            for sub in list(proc.subscribers):
                sub.push(broken)

    def shutdown(self) -> None:
        """Kill everything still running (the daemon is going away; leave no orphans)."""
        for proc in list(self._procs.values()):
            _killpg(proc.pid, signal.SIGKILL)
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_signal_handler(signal.SIGCHLD)

    # --- queries ---------------------------------------------------------------------------

    def list(self) -> list[Process]:
        return [p for p in self._procs.values() if not p.ended]

    def get(self, *, pid: int | None = None, tag: str | None = None) -> Process:
        if pid is not None:
            proc = self._procs.get(pid)
            if proc is not None and not proc.ended:
                return proc
            raise ProcessError("not_found", f"process with pid {pid} not found")
        if tag:
            for proc in self._procs.values():
                if proc.spec.tag == tag and not proc.ended:
                    return proc
            raise ProcessError("not_found", f"process with tag {tag!r} not found")
        raise ProcessError("invalid_argument", "a process selector (pid or tag) is required")

    # --- start -----------------------------------------------------------------------------

    def start(self, spec: ProcessSpec, *, timeout: float | None) -> tuple[Process, Subscriber]:
        loop = self._loop or asyncio.get_running_loop()
        user = spec.user
        home = user.home if user is not None else self._root
        cwd = self._resolve_cwd(spec.cwd, home)
        env = {**self._base_env(), **(user.env() if user is not None else {}), **spec.envs}
        # As E2B's envd: the user's uid, gid and groups (the daemon is the sandbox's root).
        switch = user is not None and not user.is_self
        uid = user.uid if user is not None and switch else None
        gid = user.gid if user is not None and switch else None
        groups = list(user.groups) if user is not None and switch else None
        argv = [spec.cmd, *spec.args]
        if not spec.cmd:
            raise ProcessError("invalid_argument", "process.cmd is empty")
        master: int | None = None
        slave: int | None = None
        try:
            if spec.pty_size is not None:
                master, slave = os.openpty()
                _set_winsize(master, *spec.pty_size)
                if user is not None and switch:
                    with contextlib.suppress(OSError):  # its terminal is the user's, as at login
                        os.fchown(slave, user.uid, user.gid)
                popen = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=slave,
                    stdout=slave,
                    stderr=slave,
                    start_new_session=True,
                    close_fds=True,
                    preexec_fn=_take_controlling_tty,  # noqa: PLW1509 - the daemon has no threads
                    user=uid,
                    group=gid,
                    extra_groups=groups,
                )
            else:
                popen = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.PIPE if spec.stdin else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    close_fds=True,
                    user=uid,
                    group=gid,
                    extra_groups=groups,
                )
        except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
            if master is not None:
                os.close(master)
            raise ProcessError("invalid_argument", f"cannot start {spec.cmd!r}: {exc}") from exc
        except OSError as exc:
            if master is not None:
                os.close(master)
            raise ProcessError("internal", f"cannot start {spec.cmd!r}: {exc}") from exc
        finally:
            if slave is not None:
                os.close(slave)

        proc = Process(pid=popen.pid, spec=spec, popen=popen)
        if master is not None:
            proc.pty_fd = master
            proc.output_fds[master] = "pty"
        else:
            assert popen.stdout is not None
            assert popen.stderr is not None
            for name, pipe in (("stdout", popen.stdout), ("stderr", popen.stderr)):
                proc.output_fds[pipe.fileno()] = name
                proc.pipes[pipe.fileno()] = pipe
            if popen.stdin is not None:
                proc.stdin_fd = popen.stdin.fileno()
                os.set_blocking(proc.stdin_fd, False)
        sub = proc.subscribe()  # before any output can be read: the starter sees everything
        self._procs[proc.pid] = proc
        for fd in proc.output_fds:
            os.set_blocking(fd, False)
            loop.add_reader(fd, self._on_readable, proc, fd)
        if timeout is not None and timeout > 0:
            proc.deadline = loop.call_later(timeout, self._deadline, proc)
        log.info("started pid=%s cmd=%s", proc.pid, spec.cmd)
        return proc, sub

    def _deadline(self, proc: Process) -> None:
        proc.deadline_hit = True
        _killpg(proc.pid, signal.SIGKILL)

    def _resolve_cwd(self, cwd: str | None, home: str) -> str:
        """The process's cwd: as given (relative: to the user's home), else the default workdir
        (``/init``), else the user's home (E2B: ``/home/user``)."""
        if not cwd:
            return self._default_cwd() or home
        resolved = cwd if os.path.isabs(cwd) else os.path.join(home, cwd)
        if not os.path.isdir(resolved):
            raise ProcessError("invalid_argument", f"cwd {cwd!r} is not a directory")
        return resolved

    # --- input, signals, resize ------------------------------------------------------------

    async def send_input(self, proc: Process, data: bytes, *, pty: bool) -> None:
        fd = proc.pty_fd if pty or proc.pty_fd is not None else proc.stdin_fd
        if fd is None:
            raise ProcessError("failed_precondition", f"process {proc.pid} has no open stdin")
        await _write_all(fd, data)

    def close_stdin(self, proc: Process) -> None:
        if proc.pty_fd is not None:
            raise ProcessError("failed_precondition", "cannot close stdin of a PTY; send ^D")
        if proc.stdin_fd is None:
            return
        fd, proc.stdin_fd = proc.stdin_fd, None
        assert proc.popen.stdin is not None
        with contextlib.suppress(OSError):
            proc.popen.stdin.close()
        del fd

    def signal(self, proc: Process, sig: int) -> None:
        _killpg(proc.pid, sig)

    async def reaped(self, proc: Process, within: float) -> None:
        """Wait (bounded) until ``proc`` is reaped: after a SIGKILL, the caller's next request
        must not find it as a zombie that ``kill -0`` still sees (E2B's kill is synchronous)."""
        deadline = time.monotonic() + within
        while proc.wait_status is None and time.monotonic() < deadline:
            self.reap()
            if proc.wait_status is None:
                await asyncio.sleep(0.005)

    def resize(self, proc: Process, cols: int, rows: int) -> None:
        if proc.pty_fd is None:
            raise ProcessError("failed_precondition", f"process {proc.pid} has no PTY")
        _set_winsize(proc.pty_fd, cols, rows)

    # --- output and exit -------------------------------------------------------------------

    def _on_readable(self, proc: Process, fd: int) -> None:
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:  # EIO on a PTY master once every slave fd is closed
            data = b""
        if not data:
            self._close_output(proc, fd)
            return
        item = Output(proc.output_fds[fd], data)
        if self._on_output is not None:
            self._on_output()
        for sub in list(proc.subscribers):
            sub.push(item)

    def _close_output(self, proc: Process, fd: int) -> None:
        if fd not in proc.output_fds:
            return
        loop = self._loop or asyncio.get_running_loop()
        loop.remove_reader(fd)
        del proc.output_fds[fd]
        if fd == proc.pty_fd:
            proc.pty_fd = None
            os.close(fd)
        else:
            proc.pipes.pop(fd).close()
        self._maybe_finish(proc)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            if pid == 0:
                return
            proc = self._procs.get(pid)
            if proc is None:
                on_exit = self._watched.pop(pid, None)
                if on_exit is not None:  # a child started elsewhere in the daemon (sudo)
                    on_exit(status)
                continue  # an orphan re-parented to us, or already gone: reaped, nothing else
            proc.wait_status = status
            proc.popen.returncode = os.waitstatus_to_exitcode(status)
            if proc.deadline is not None:
                proc.deadline.cancel()
            if proc.output_fds:
                loop = self._loop or asyncio.get_running_loop()
                proc.grace = loop.call_later(OUTPUT_DRAIN_GRACE, self._force_finish, proc)
            self._maybe_finish(proc)

    def _force_finish(self, proc: Process) -> None:
        for fd in list(proc.output_fds):
            # Read what is buffered right now, then stop waiting for grandchildren.
            self._on_readable(proc, fd)
            self._close_output(proc, fd)

    def _maybe_finish(self, proc: Process) -> None:
        if proc.ended or proc.wait_status is None or proc.output_fds:
            return
        proc.ended = True
        if proc.grace is not None:
            proc.grace.cancel()
        if proc.stdin_fd is not None:
            self.close_stdin(proc)
        end = describe_wait_status(proc.wait_status)
        item: Exit | Broken = end
        if self.closing:
            item = Broken("unavailable", "envd is stopping: the sandbox is being stopped")
        elif proc.deadline_hit:
            item = Broken("deadline_exceeded", "the command's deadline was exceeded")
        for sub in list(proc.subscribers):
            sub.push(item)
        self._procs.pop(proc.pid, None)
        log.info("ended pid=%s %s", proc.pid, end.status)


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    except PermissionError:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def _set_winsize(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _take_controlling_tty() -> None:
    # Runs in the child after setsid() and the dup2 of the slave onto fd 0: make the PTY the
    # session's controlling terminal so job control and ^C work in ``bash -i``.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _resolve_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _write_all(fd: int, data: bytes) -> None:
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            ready = loop.create_future()
            loop.add_writer(fd, _resolve_once, ready)
            try:
                await ready
            finally:
                loop.remove_writer(fd)
            continue
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.EBADF, errno.EIO):
                raise ProcessError("failed_precondition", f"stdin is closed: {exc}") from exc
            raise
        view = view[written:]
