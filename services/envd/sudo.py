"""The daemon's side of ``sudo`` in a sandbox (the client is deploy/sandbox-base/sudo).

A sandbox cannot run setuid programs (bubblewrap mounts nosuid and sets no_new_privs), so
``sudo`` asks the daemon, which is the sandbox's root, over a unix socket inside the sandbox
(``--sudo-socket``, ``/run/torpor/sudo.sock`` in local pods). One request per connection: a
JSON line ``{"user", "argv", "login", "shell", "env", "cwd"}`` sent with the caller's stdin,
stdout and stderr as SCM_RIGHTS descriptors; then optional ``{"signal": N}`` lines (forwarded to
the command's process group); the daemon answers ``{"exit": code}`` or ``{"error": message}``.

Passwordless for everyone in the sandbox, as E2B's ``user`` has it. What it grants stays inside
the sandbox: its root is an unprivileged id range on the host with capabilities only over the
sandbox's own namespaces.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import json
import logging
import os
import pwd
import shlex
import signal
import socket
import struct
import subprocess
from typing import Any

from services.envd.processes import ProcessTable
from services.envd.users import Identity, UnknownUser, Users

log = logging.getLogger("envd.sudo")

MAX_REQUEST_BYTES = 1024 * 1024
SECURE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FORWARDED_SIGNALS = frozenset({signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM})
_FD_SPACE = socket.CMSG_SPACE(16 * array.array("i").itemsize)


class BadRequest(ValueError):
    pass


class SudoServer:
    def __init__(self, path: str, *, users: Users, table: ProcessTable) -> None:
        self._path = path
        self._users = users
        self._table = table
        self._sock: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        os.makedirs(os.path.dirname(self._path), mode=0o755, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self._path)
        # Every user of the sandbox may ask (passwordless sudo, as E2B's `user` has).
        os.chmod(self._path, 0o666)  # noqa: S103
        sock.listen(64)
        sock.setblocking(False)
        self._sock = sock
        self._task = asyncio.create_task(self._accept())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for task in list(self._handlers):
            task.cancel()
        if self._sock is not None:
            self._sock.close()

    async def _accept(self) -> None:
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(self._sock)
            conn.setblocking(False)
            task = asyncio.create_task(self._serve(conn))
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)

    async def _serve(self, conn: socket.socket) -> None:
        fds: list[int] = []
        try:
            with conn:
                try:
                    data, fds = await _read_request(conn)
                    request = _parse(data, fds)
                    who = self._users.resolve(request["user"])
                    process = self._spawn(request, who, fds, caller=_peer_name(conn))
                except (BadRequest, UnknownUser, OSError, subprocess.SubprocessError) as exc:
                    await _reply(conn, {"error": str(exc)})
                    return
                finally:
                    for fd in fds:
                        os.close(fd)
                    fds = []
                log.info("sudo: pid %s as %s: %s", process.pid, who.name, request["argv"][:8])
                await _reply(conn, {"exit": await self._wait(conn, process)})
        except (ConnectionError, OSError):
            return  # the caller went away; its command keeps running, as with sudo

    def _spawn(
        self, request: dict[str, Any], who: Identity, fds: list[int], *, caller: str
    ) -> subprocess.Popen[bytes]:
        shell = _shell_of(who)
        argv: list[str] = request["argv"]
        if request["login"] or request["shell"]:
            command = ["-c", " ".join(shlex.quote(a) for a in argv)] if argv else []
            argv = [shell, *(["-l"] if request["login"] else []), *command]
        cwd = who.home if request["login"] else request["cwd"]
        if not os.path.isdir(cwd):
            cwd = who.home if os.path.isdir(who.home) else "/"
        env = {
            **request["env"],
            "PATH": SECURE_PATH,
            **who.env(),
            "SHELL": shell,
            "SUDO_COMMAND": " ".join(argv)[:4096],
            "SUDO_USER": caller,
        }
        switch = not who.is_self
        # The sandbox's own sudo: it runs what it is asked to.
        return subprocess.Popen(
            argv,
            stdin=fds[0],
            stdout=fds[1],
            stderr=fds[2],
            cwd=cwd,
            env=env,
            close_fds=True,
            start_new_session=True,
            user=who.uid if switch else None,
            group=who.gid if switch else None,
            extra_groups=list(who.groups) if switch else None,
        )

    async def _wait(self, conn: socket.socket, process: subprocess.Popen[bytes]) -> int:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()

        def on_exit(status: int) -> None:
            process.returncode = os.waitstatus_to_exitcode(status)
            code = os.waitstatus_to_exitcode(status)
            if not done.done():
                done.set_result(code if code >= 0 else 128 - code)

        self._table.watch(process.pid, on_exit)
        forward = asyncio.create_task(self._forward_signals(conn, process.pid))
        try:
            return await done
        finally:
            forward.cancel()

    async def _forward_signals(self, conn: socket.socket, pid: int) -> None:
        loop = asyncio.get_running_loop()
        buffer = b""
        while True:
            chunk = await loop.sock_recv(conn, 4096)
            if not chunk:
                return  # the caller went away: the command keeps running
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                with contextlib.suppress(ValueError, TypeError, AttributeError):
                    number = int(json.loads(line)["signal"])
                    if number in FORWARDED_SIGNALS:
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(pid, number)
            if len(buffer) > 4096:
                return


async def _read_request(conn: socket.socket) -> tuple[bytes, list[int]]:
    """The request line and the descriptors that came with it (never more than 16 kept)."""
    loop = asyncio.get_running_loop()
    data = b""
    fds: list[int] = []
    while not data.endswith(b"\n"):
        try:
            chunk, ancillary, _, _ = conn.recvmsg(65536, _FD_SPACE)
        except BlockingIOError:
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_reader(conn.fileno(), _set_done, ready)
            try:
                await asyncio.wait_for(ready, 10)
            finally:
                loop.remove_reader(conn.fileno())
            continue
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                received = array.array("i")
                received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
                fds += list(received)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST_BYTES:
            for fd in fds:
                os.close(fd)
            raise BadRequest("request too large")
    return data, fds


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _parse(data: bytes, fds: list[int]) -> dict[str, Any]:
    if len(fds) != 3:
        raise BadRequest(f"expected stdin, stdout and stderr, got {len(fds)} descriptors")
    try:
        request = json.loads(data)
    except ValueError as exc:
        raise BadRequest("malformed request") from exc
    if not isinstance(request, dict):
        raise BadRequest("malformed request")
    argv, env = request.get("argv"), request.get("env")
    if not isinstance(argv, list) or not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise BadRequest("argv must be a list of strings without NUL")
    if not argv and not (request.get("login") or request.get("shell")):
        raise BadRequest("no command")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\0" not in k + v
        for k, v in env.items()
    ):
        raise BadRequest("env must map names to strings")
    user, cwd = request.get("user"), request.get("cwd")
    if not isinstance(user, str) or not user:
        raise BadRequest("user must be a name")
    if not isinstance(cwd, str) or "\0" in cwd:
        raise BadRequest("cwd must be a path")
    return {
        "user": user,
        "argv": argv,
        "env": env,
        "cwd": cwd,
        "login": bool(request.get("login")),
        "shell": bool(request.get("shell")),
    }


def _peer_name(conn: socket.socket) -> str:
    """The connecting process's user (SO_PEERCRED: what the kernel says, not the request)."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    uid = struct.unpack("3i", raw)[1]
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _shell_of(who: Identity) -> str:
    try:
        shell = pwd.getpwnam(who.name).pw_shell
    except KeyError:
        shell = ""
    return shell if shell and os.path.exists(shell) else "/bin/sh"


async def _reply(conn: socket.socket, answer: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        await asyncio.get_running_loop().sock_sendall(conn, json.dumps(answer).encode() + b"\n")
