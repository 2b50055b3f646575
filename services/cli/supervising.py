"""One asyncio supervisor for the services of ``torpor up``.

Each service is its own OS process (``<python> -m services.cli run <name>``) in its own session,
so a signal to its process group reaches everything it spawned. A service that exits is restarted
with exponential backoff; the others keep running. Shutdown: SIGTERM every group, wait, SIGKILL
the stragglers (the caller stops NATS last).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from services.cli.catalog import ServiceSpec
from services.cli.probing import http_status

_PR_SET_PDEATHSIG = 1
# The supervisor runs ``<python> -m SERVICE_MODULE run <name>`` for each service. The one hook
# for tests: tests/support/placeholder.py points it at idle stand-ins to test the supervisor and
# the bus's users without the services' own code.
SERVICE_MODULE = "services.cli"


_libc = ctypes.CDLL(None, use_errno=True)  # loaded before fork: the child only makes one call


def _child_setup() -> None:
    """Runs in the child between fork and exec: die with the supervisor even if it is SIGKILLed."""
    with contextlib.suppress(Exception):
        _libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


@dataclass
class Child:
    spec: ServiceSpec
    health_port: int
    # The supervisor's listening socket on health_port, handed to every run of the service: no
    # other process can take the port between the pick and a start, or while it restarts.
    health_socket: socket.socket | None = field(default=None, repr=False)
    port: int | None = None  # the public port, for api/proxy
    env: dict[str, str] = field(default_factory=dict, repr=False)  # its own (bus credentials)
    pid: int | None = None
    state: str = "pending"
    restarts: int = 0
    started_at: float = 0.0
    last_exit: int | None = None
    failures: int = 0
    process: asyncio.subprocess.Process | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def uptime(self) -> float:
        return time.monotonic() - self.started_at if self.alive else 0.0


Notify = Callable[[str, Child, str], None]
PROBED = frozenset({"starting", "ready", "running", "not ready"})  # the states a probe may change


def _ignore(event: str, child: Child, detail: str) -> None:
    del event, child, detail


@dataclass
class Supervisor:
    children: Sequence[Child]
    env: Mapping[str, str]
    log_dir: Path
    python: str = sys.executable
    grace: float = 10.0
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    stable_after: float = 30.0  # a run this long resets the backoff
    notify: Notify = _ignore
    _stopping: bool = False
    _stopped: asyncio.Event = field(default_factory=asyncio.Event)

    def command(self, child: Child) -> list[str]:
        return [self.python, "-m", SERVICE_MODULE, "run", child.name]

    async def _spawn(self, child: Child) -> None:
        env = {
            **self.env,
            **child.env,
            "TORPOR_HEALTH_PORT": str(child.health_port),
            "PYTHONUNBUFFERED": "1",
        }
        if child.port is not None:
            env |= {"TORPOR_HOST": "127.0.0.1", "TORPOR_PORT": str(child.port)}
        handed: tuple[int, ...] = ()
        if child.health_socket is not None:
            handed = (child.health_socket.fileno(),)
            env["TORPOR_HEALTH_FD"] = str(handed[0])
        self.log_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.log_dir, 0o700)
        with _open_log(self.log_dir / f"{child.name}.log") as log:
            child.process = await asyncio.create_subprocess_exec(
                *self.command(child),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
                preexec_fn=_child_setup,
                pass_fds=handed,
            )
        child.pid = child.process.pid
        child.started_at = time.monotonic()
        child.state = "starting"
        self.notify("started", child, f"pid={child.pid}")

    async def _keep(self, child: Child) -> None:
        """Run one service until shutdown, restarting it with backoff when it exits."""
        while not self._stopping:
            await self._spawn(child)
            assert child.process is not None
            code = await child.process.wait()
            child.last_exit = code
            _kill_group(child.pid, signal.SIGKILL)  # leftovers of the dead service's group
            if self._stopping:
                break
            ran = time.monotonic() - child.started_at
            child.failures = 1 if ran >= self.stable_after else child.failures + 1
            delay = min(self.backoff_max, self.backoff_base * 2 ** (child.failures - 1))
            child.restarts += 1
            child.state = "restarting"
            self.notify("exited", child, f"code={code} restart_in={delay:.1f}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), delay)
        child.state = "stopped"

    async def _probe(self) -> None:
        while not self._stopping:
            for child in self.children:
                # "not ready" too: a service slow to start (over 10 s on a loaded machine) is
                # still watched, and becomes ready when it is (CI: the scheduler stayed "not
                # ready" in the listing for good).
                if not child.alive or child.state not in PROBED:
                    continue
                status = await http_status("127.0.0.1", child.health_port, "/readyz")
                if status != 200 and child.port is not None:
                    status = await http_status("127.0.0.1", child.port, child.spec.public_probe)
                before = child.state
                if status == 200:
                    child.state = "ready"
                elif child.uptime() > 10 or before == "ready":
                    child.state = "running" if status is None else "not ready"
                if child.state != before:
                    self.notify(child.state, child, f"pid={child.pid}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), 1.0)

    async def run(self, stop: asyncio.Event) -> None:
        """Supervise until ``stop`` is set, then shut every service down."""
        keepers = [asyncio.create_task(self._keep(c), name=f"keep-{c.name}") for c in self.children]
        prober = asyncio.create_task(self._probe(), name="probe")
        try:
            await stop.wait()
        finally:
            self._stopping = True
            self._stopped.set()
            await self._terminate_all()
            prober.cancel()
            for task in (*keepers, prober):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _terminate_all(self) -> None:
        alive = [c for c in self.children if c.alive]
        for child in alive:
            child.state = "stopping"
            self.notify("stopping", child, f"pid={child.pid}")
            _kill_group(child.pid, signal.SIGTERM)
        waits = [c.process.wait() for c in alive if c.process is not None]
        if waits:
            await asyncio.wait([asyncio.ensure_future(w) for w in waits], timeout=self.grace)
        for child in self.children:
            if child.alive:
                self.notify("killing", child, f"pid={child.pid} did not stop in {self.grace:.0f}s")
            # Also reaches grandchildren whose leader already exited.
            _kill_group(child.pid, signal.SIGKILL)
        for child in self.children:
            if child.process is not None and child.process.returncode is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(child.process.wait(), 5)
            child.state = "stopped"


def _kill_group(pid: int | None, sig: signal.Signals) -> None:
    """Signal the process group a child leads (children start in their own session)."""
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _open_log(path: Path) -> IO[bytes]:
    """Append-only, owner-only: a log line must never hand a token to another local user."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.chmod(path, 0o600)
    return os.fdopen(fd, "ab")
