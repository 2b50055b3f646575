"""Real snapshotter and scaler processes (``python -m services.cli run <name>``) on a private NATS
and local-runtime data dir, which a test may ``kill -9`` and restart at will.

To keep crash recovery fast the durables get ``ack_wait`` = 4 s (a killed handler's message is
redelivered after that) and handlers heartbeat every second; the services are told not to
converge the topology themselves (``TORPOR_BUS_PROVISION=false``) so they keep these settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import nats

from shared.bus.server import free_port
from shared.bus.topology import DURABLES, ensure_topology
from shared.runtime.local import LocalRuntime

REPO = Path(__file__).resolve().parents[2]
ACK_WAIT = 4.0


async def provision(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_topology(js)
        for durable in DURABLES:
            await js.add_consumer(
                durable.stream, dataclasses.replace(durable, backoff=(ACK_WAIT,)).config()
            )
    finally:
        await nc.close()


class Services:
    def __init__(self, *, nats_url: str, data_dir: Path, logs: Path) -> None:
        self.env = {
            **os.environ,
            "NATS_URL": nats_url,
            "TORPOR_RUNTIME": "local",
            "TORPOR_DATA_DIR": str(data_dir),
            "TORPOR_HEALTH_HOST": "127.0.0.1",
            "TORPOR_BUS_PROVISION": "false",
            "TORPOR_GIVE_UP_AFTER": "10",
            "TORPOR_HEARTBEAT_SECONDS": "1",
            "TORPOR_READY_TIMEOUT": "30",
            "TORPOR_LOG_LEVEL": "warning",
            "PYTHONUNBUFFERED": "1",
        }
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.kills = 0
        self.ports: dict[str, int] = {}

    async def wait_ready(self, name: str, *, timeout: float = 60.0) -> None:
        """Until the service answers ``/readyz`` (bus connected, subscribers started)."""
        url = f"http://127.0.0.1:{self.ports[name]}/readyz"
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=1.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                if self.procs[name].poll() is not None:
                    raise RuntimeError(f"{name} exited with {self.procs[name].returncode}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(url)).status_code == 200:
                        return
                await asyncio.sleep(0.1)
        raise TimeoutError(f"{name} not ready within {timeout}s")

    def start(self, name: str) -> None:
        """``name`` is ``snapshotter`` or ``scaler`` optionally with a replica suffix (``scaler#2``)."""
        service = name.split("#", 1)[0]
        port = self.ports.setdefault(name, free_port())
        log = (self.logs / f"{name.replace('#', '-')}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "run", service],
            cwd=REPO,
            env={**self.env, "TORPOR_HEALTH_PORT": str(port)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def kill9(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            self.kills += 1

    def dump_tasks(self) -> None:
        """Ask every live service to log its asyncio task stacks (``SIGUSR2``, for diagnosis)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGUSR2)

    def alive(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@contextlib.asynccontextmanager
async def observer_runtime(nats_url: str, data_dir: Path) -> AsyncIterator[LocalRuntime]:
    """A read-only view of the services' workloads; on exit it stops every pod of the data dir
    (the services never stop pods, by design) so the test leaves nothing running."""
    runtime = LocalRuntime(
        nats_url=nats_url,
        data_dir=data_dir,
        supervise=False,
        stop_pods_on_close=True,
    )
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.close()
