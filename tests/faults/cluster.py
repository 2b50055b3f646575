"""The whole system as real processes that a fault-injection test may break at will.

A private nats-server (restartable on the same port and store), then api, proxy, scheduler,
snapshotter and scaler, each ``python -m services.cli run <name>`` in its own session on the local
runtime (bubblewrap pods). api and proxy keep their ports across restarts.

Crash recovery is made fast the way ``tests/chaos`` does it: durables get a 4 s ack wait (a killed
handler's message comes back after that), handlers heartbeat every second, and the services do
not converge the topology themselves, so they keep those settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from shared.bus.server import EmbeddedNats, free_port
from shared.runtime.local import procfs
from tests.chaos.cluster import provision

REPO = Path(__file__).resolve().parents[2]
SERVICES = ("api", "proxy", "scheduler", "snapshotter", "scaler")
USER = "faults"
_POD_UID = re.compile(rb"/pods/([0-9a-f-]{36})/")


@dataclass
class FaultCluster:
    root: Path
    give_up_after: int = 4
    nats: EmbeddedNats | None = None
    ports: dict[str, int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    api_key: str = ""

    @property
    def data_dir(self) -> Path:
        return self.root / "rt"

    @property
    def nats_url(self) -> str:
        assert self.nats is not None
        return self.nats.url

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['api']}"

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['proxy']}"

    async def start(self) -> None:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        self.nats = EmbeddedNats(data_dir=self.root / "nats").start()
        await provision(self.nats.url)
        self.api_key = await _make_key(self.nats.url)
        for name in SERVICES:
            self.ports[name] = free_port()
            self.start_service(name)
        await asyncio.gather(*(self.wait_ready(name) for name in SERVICES))

    def env(self, name: str) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("TORPOR_", "E2B_", "NATS_"))
        }
        env.update(
            {
                "NATS_URL": self.nats_url,
                "TORPOR_RUNTIME": "local",
                "TORPOR_DATA_DIR": str(self.data_dir),
                "TORPOR_HEALTH_HOST": "127.0.0.1",
                "TORPOR_BUS_PROVISION": "false",
                "TORPOR_GIVE_UP_AFTER": str(self.give_up_after),
                "TORPOR_HEARTBEAT_SECONDS": "1",
                "TORPOR_READY_TIMEOUT": "30",
                "TORPOR_ENVD_TIMEOUT": "3",
                "TORPOR_LOG_LEVEL": "info",
                "TORPOR_LOG_FORMAT": "json",
                "PAUSE_RESUME": "true",
                "PYTHONUNBUFFERED": "1",
            }
        )
        if name in ("api", "proxy"):
            env |= {
                "TORPOR_HOST": "127.0.0.1",
                "TORPOR_PORT": str(self.ports[name]),
                "TORPOR_HEALTH_PORT": str(free_port()),
            }
        else:
            env["TORPOR_HEALTH_PORT"] = str(self.ports[name])
        return env

    def start_service(self, name: str) -> None:
        with (self.root / "logs" / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "run", name],
                cwd=REPO,
                env=self.env(name),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def kill9(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    async def restart_nats(self) -> None:
        assert self.nats is not None
        await asyncio.to_thread(self.nats.restart)

    async def wait_ready(self, name: str, timeout: float = 90.0) -> None:
        port = self.ports[name]
        path = "/health" if name in ("api", "proxy") else "/readyz"
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=2) as http:
            while time.monotonic() < deadline:
                if not self.alive(name):
                    msg = f"{name} exited with {self.procs[name].returncode}; see {self.root}/logs"
                    raise RuntimeError(msg)
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(f"http://127.0.0.1:{port}{path}")).status_code == 200:
                        return
                await asyncio.sleep(0.2)
        msg = f"{name} not ready within {timeout}s"
        raise RuntimeError(msg)

    def stop(self) -> None:
        self.stop_services()
        if self.nats is not None:
            self.nats.stop()

    def stop_services(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for name, proc in self.procs.items():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            self.kill9(name)
        for pid in daemon_pids(self.data_dir):  # a SIGSTOPped daemon cannot die until continued
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


async def _make_key(nats_url: str) -> str:
    from shared.auth.keys import KvApiKeys, KvUsers
    from shared.bus.broker import key_value, make_broker
    from shared.bus.kv import NatsBucket
    from shared.bus.topology import KV_API_KEYS, KV_USERS
    from shared.settings import BusSettings

    broker = make_broker(BusSettings(nats_url=nats_url, bus_provision=False), service="faults")
    await broker.connect()
    try:
        users = KvUsers(NatsBucket(await key_value(broker, KV_USERS)))
        keys = KvApiKeys(NatsBucket(await key_value(broker, KV_API_KEYS)), users)
        return (await keys.create(USER, admin=False))[1]
    finally:
        await broker.stop()


# ---------------------------------------------------------------- processes of the pods


def _cmdlines() -> list[tuple[int, list[bytes]]]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            found.append((int(entry.name), (entry / "cmdline").read_bytes().split(b"\0")))
        except OSError:
            continue
    return found


def bwrap_pod_uids(data_dir: Path) -> dict[str, int]:
    """Pod uid → pid of every bwrap pod of this data dir (the pods that really exist)."""
    marker = str(data_dir).encode()
    pods: dict[str, int] = {}
    for pid, argv in _cmdlines():
        if argv and os.path.basename(argv[0]) == b"bwrap":
            joined = b" ".join(argv)
            if marker in joined and (m := _POD_UID.search(joined)):
                pods.setdefault(m.group(1).decode(), pid)
    return pods


def daemon_pid(host: str) -> int | None:
    """The in-sandbox daemon listening on ``host`` (inside bwrap, so not bwrap itself)."""
    listen = f"{host}:49983".encode()
    for pid, argv in _cmdlines():
        if argv and os.path.basename(argv[0]) != b"bwrap" and b"services.envd" in argv:
            if listen in argv:
                return pid
    return None


def daemon_pids(data_dir: Path) -> list[int]:
    """The daemons of this data dir's pods: processes under its bwraps (a daemon cannot outlive
    its bwrap, PID 1 of its namespace)."""
    under = {p for pid in bwrap_pod_uids(data_dir).values() for p in procfs.descendants(pid)}
    return [
        pid
        for pid, argv in _cmdlines()
        if pid in under and os.path.basename(argv[0]) != b"bwrap" and b"services.envd" in argv
    ]
