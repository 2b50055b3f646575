"""A real nats-server started with the SHIPPED ``deploy/nats/auth.conf`` and known test passwords.

The shipped file takes every password from the environment (``$NATS_<USER>_PASSWORD``); here the
environment holds ``test-<user>``, so the test variant is the very same file.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import nats
from nats.aio.client import Client

from shared.bus.server import find_nats_server, free_ports
from tests.support.processes import terminate

REPO = Path(__file__).resolve().parents[2]
NATS_DIR = REPO / "deploy" / "nats"


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("torpor_gen_auth", NATS_DIR / "gen_auth.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


def password(user: str) -> str:
    return f"test-{user}"


@dataclass
class AuthNats:
    folder: Path
    users: list[str]
    port: int = 0
    monitor: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def url(self, user: str) -> str:
        return f"nats://{user}:{password(user)}@127.0.0.1:{self.port}"

    def start(self) -> AuthNats:
        self.port, self.monitor = free_ports(2)
        # The shipped files, byte-identical except the four lines that name pod paths/ports.
        shutil.copy(NATS_DIR / "auth.conf", self.folder / "auth.conf")
        shutil.copy(NATS_DIR / "cluster-single.conf", self.folder / "cluster.conf")
        store = self.folder / "store"
        local = {
            "listen: 0.0.0.0:4222": f"listen: 127.0.0.1:{self.port}",
            "http: 0.0.0.0:8222": f"http: 127.0.0.1:{self.monitor}",
            "store_dir: /data": f'store_dir: "{store}"',
            "pid_file: /var/run/nats/nats.pid": f'pid_file: "{self.folder / "nats.pid"}"',
        }
        conf = (NATS_DIR / "nats.conf").read_text()
        for shipped, here in local.items():
            assert shipped in conf, f"deploy/nats/nats.conf no longer has {shipped!r}"
            conf = conf.replace(shipped, here)
        (self.folder / "nats.conf").write_text(conf)
        env = {
            **os.environ,
            "POD_NAME": "torpor-nats-0",
            "NATS_MAX_FILE_STORE": "1G",
            **{f"NATS_{u.upper()}_PASSWORD": password(u) for u in self.users},
        }
        log = (self.folder / "nats.log").open("ab")
        self.proc = subprocess.Popen(
            [find_nats_server(), "-c", str(self.folder / "nats.conf")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 15
        url = f"http://127.0.0.1:{self.monitor}/healthz?js-enabled-only=true"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError((self.folder / "nats.log").read_text()[-3000:])
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url, timeout=0.5) as r:
                    if r.status == 200:
                        return self
            time.sleep(0.05)
        raise RuntimeError("nats-server with the shipped auth.conf did not become ready")

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)


def start_auth_nats(folder: Path) -> Iterator[AuthNats]:
    users = [u.name for u in load_generator().users()]
    folder.mkdir(parents=True, exist_ok=True)
    server = AuthNats(folder=folder, users=users).start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Errors:
    """Asynchronous errors the server sent (permission violations arrive only this way)."""

    seen: list[str] = field(default_factory=list)

    async def record(self, e: Exception) -> None:
        self.seen.append(str(e))

    def violations(self) -> list[str]:
        # nats-py lower-cases the server's -ERR text.
        return [e.lower() for e in self.seen if "permissions violation" in e.lower()]

    async def wait_violation(self, needle: str, timeout: float = 3.0) -> str:
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            for e in self.violations():
                if needle.lower() in e:
                    return e
            await asyncio.sleep(0.02)
        raise AssertionError(f"no permission violation for {needle!r}; saw {self.seen}")


@contextlib.asynccontextmanager
async def connect(
    server: AuthNats, user: str, **kwargs: Any
) -> AsyncIterator[tuple[Client, Errors]]:
    errors = Errors()
    nc = await nats.connect(
        server.url(user),
        error_cb=errors.record,
        allow_reconnect=False,
        name=f"test-{user}",
        **kwargs,
    )
    try:
        yield nc, errors
    finally:
        await nc.close()
