"""``torpor up`` on free loopback ports with a temp data dir, as seen by a bus client: the port of
its embedded NATS and the passwords it generated (``<data dir>/nats/credentials.json``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from services.cli import catalog
from shared.bus.server import free_ports
from tests.support import placeholder, pods, processes
from tests.support.env import cli_env
from tests.support.stack import up_args


@dataclass
class EmbeddedBus:
    """Duck-types ``tests.deploy.nats_auth.AuthNats`` (``url(user)``), so the deploy tests'
    checks run unchanged against ``torpor up``'s bus."""

    data_dir: Path
    port: int
    passwords: dict[str, str]

    def url(self, user: str) -> str:
        return f"nats://{user}:{self.passwords[user]}@127.0.0.1:{self.port}"

    @property
    def anonymous_url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @classmethod
    def of(cls, data_dir: Path) -> EmbeddedBus:
        state = json.loads((data_dir / "torpor.json").read_text())
        passwords = json.loads((data_dir / "nats" / "credentials.json").read_text())
        return cls(data_dir, int(state["nats_url"].rsplit(":", 1)[1]), passwords)


@contextlib.contextmanager
def placeholder_up(root: Path, *, timeout: float = 90) -> Iterator[EmbeddedBus]:
    """``torpor up`` with every service an idle placeholder (``tests/support/placeholder.py``):
    each connects as its own user but binds no durable, so a test can use the service users
    itself without competing."""
    data_dir = root / "data"
    proc = processes.spawn(
        up_args(data_dir, *free_ports(2)),
        env=cli_env(TORPOR_TUNING="STOP_GRACE=5"),
        log=root / "up.log",
        command=placeholder.COMMAND,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError((root / "up.log").read_text(errors="replace")[-3000:])
            logs = [data_dir / "logs" / f"{n}.log" for n in catalog.NAMES]
            if (data_dir / "torpor.json").exists() and all(
                p.exists() and placeholder.READY in p.read_text(errors="replace") for p in logs
            ):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(_not_ready(root, data_dir, timeout))
            time.sleep(0.3)
        yield EmbeddedBus.of(data_dir)
    finally:
        processes.stop([proc], sig=signal.SIGINT, grace=30, group=False)


def _not_ready(root: Path, data_dir: Path, timeout: float) -> str:
    """Why the instance is not ready: the tail of ``torpor up``'s output and of the log of every
    placeholder that has not logged its readiness (a CI failure is diagnosed from this alone)."""
    parts = [f"placeholder torpor up was not ready in {timeout:.0f} s"]
    if not (data_dir / "torpor.json").exists():
        parts.append("no torpor.json yet")
    parts.append("up.log: " + _tail(root / "up.log"))
    for name in catalog.NAMES:
        path = data_dir / "logs" / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else None
        if text is None or placeholder.READY not in text:
            parts.append(f"{name}.log: " + ("(none)" if text is None else _tail(path)))
    return "\n".join(parts)


def _tail(path: Path, size: int = 2000) -> str:
    return path.read_text(errors="replace")[-size:] if path.exists() else "(none)"


def service_pids(data_dir: Path) -> dict[str, int]:
    """The supervised service processes of one instance (``... -m services.cli run <name>``)."""
    return pods.service_pids(data_dir, catalog.NAMES)


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {k: v for k, _, v in pairs}


def listening_ports(pid: int) -> set[int]:
    """TCP ports a process listens on: its socket inodes matched against /proc/net/tcp{,6}."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A = LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def nats_server_pid(data_dir: Path) -> int:
    needle = str(data_dir / "nats" / "nats-server.conf").encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes():
                    return int(entry.name)
    raise AssertionError("the embedded nats-server is not running")
