"""The whole system for a test or a benchmark, on free loopback ports in a directory of its own.

``Stack(root)`` is a private nats-server, API keys, then every service as its own process
(``python -m services.cli run <name>``, exactly what ``torpor up`` supervises) with ``replicas``
copies of each, on the local runtime (bubblewrap pods) or, with ``runtime="kubernetes"`` and the
rig's kubeconfig in ``env``, on a kube-apiserver. A test may ``kill9`` and ``start_service`` any
of them, or ``restart_nats``. ``Stack.up(root)`` is ``torpor up`` itself instead.

``fast_redelivery``: the durables get a 4 s ack wait (a killed handler's message comes back after
that) and handlers heartbeat every second; the services are told not to converge the topology
themselves (``TORPOR_BUS_PROVISION=false``) so they keep those settings. For crash tests.

Start and stop with ``async with Stack(...)`` or, from synchronous code, ``with stack.running()``.
Stopping leaves nothing: services, pods (and their network), nats-server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import nats

from services.cli.upping import operator_bus
from shared.bus.credentials import read as read_credentials
from shared.bus.server import EmbeddedNats, free_port, free_ports
from shared.bus.topology import DURABLES, ensure_topology
from shared.runtime.local import LocalRuntime
from shared.runtime.local.network import release_instance
from shared.runtime.local.pod_dirs import unmount_stopped
from tests.support import processes
from tests.support.env import clean_env, cli_env
from tests.support.keys import USERS, make_keys
from tests.support.pods import daemon_pids, kill_pods

SERVICES = ("api", "proxy", "scheduler", "snapshotter", "scaler")
HTTP = ("api", "proxy")  # the services with a public port (the others: health only)
ACK_WAIT = 4.0  # fast_redelivery's ack wait
# The seed's "Shared Network Storage": /workspace lives on a volume, so server.py (and the
# app's files) are still there when the snapshot is replayed in a fresh pod.
SEED_TEMPLATE = """\
name: sandbox-base
workdir: /workspace
env:
  LANG: C.UTF-8
  HOME: /workspace
volumes:
  - name: workspace
    hostPath: volumes/{owner}/{sandbox_id}/workspace
    mountPath: /workspace
"""


class StackDidNotStart(RuntimeError):
    """A service (or ``torpor up``) exited or was not ready in time: off CI, tests skip."""


async def provision_fast_redelivery(nats_url: str) -> None:
    """The topology, with every durable's ack wait cut to ``ACK_WAIT``."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_topology(js)
        for durable in DURABLES:
            fast = dataclasses.replace(durable.retry, ack_wait=ACK_WAIT)
            await js.add_consumer(durable.stream, dataclasses.replace(durable, retry=fast).config())
    finally:
        await nc.close()


def service_of(key: str) -> str:
    """``scaler-2`` (the third replica) → ``scaler``."""
    return key.split("-", 1)[0]


@dataclass
class Stack:
    root: Path
    mode: Literal["services", "up"] = "services"
    # The services started with the stack (a test may start others, or more, later).
    services: tuple[str, ...] = SERVICES
    replicas: int = 1
    runtime: str = "local"
    users: Mapping[str, bool] = field(default_factory=lambda: dict(USERS))
    fast_redelivery: bool = False
    # Settings of every service (after the stack's own, so they win).
    env: dict[str, str] = field(default_factory=dict)
    # Settings of one service only (its replicas too), after ``env``.
    env_of: dict[str, dict[str, str]] = field(default_factory=dict)
    log_level: str = "debug"
    log_format: str = "json"
    # How long a service may take to answer its health check (imports are slow under load).
    ready_timeout: float = 180.0
    # A template folder the services read (``TORPOR_TEMPLATES_DIR``); None: the packaged ones.
    templates: dict[str, str] | None = None
    data_dir: Path = field(default=Path())
    log_dir: Path | None = None  # the services' logs; None: ``root/logs``
    nats: EmbeddedNats | None = None
    ports: dict[str, int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    kills: int = 0
    _nats_url: str = ""

    def __post_init__(self) -> None:
        if self.data_dir == Path():
            self.data_dir = self.root / "data"

    @classmethod
    def up(cls, root: Path, *, data_dir: Path | None = None, **env: str) -> Stack:
        """``torpor up`` (``data_dir``: another instance's, for a restart). ``PAUSE_RESUME=alice``:
        alice's autoPause sandboxes pause on expiry, bob's are killed, and the admin view has one
        user of each kind to show."""
        return cls(
            root,
            mode="up",
            env={"PAUSE_RESUME": "alice", **env},
            data_dir=data_dir or root / "data",
        )

    # ------------------------------------------------------------ where things are

    @property
    def nats_url(self) -> str:
        return self.nats.url if self.nats is not None else self._nats_url

    @property
    def logs(self) -> Path:
        if self.log_dir is not None:
            return self.log_dir
        return self.data_dir / "logs" if self.mode == "up" else self.root / "logs"

    @property
    def templates_dir(self) -> Path:
        return self.root / "templates"

    def url(self, key: str) -> str:
        return f"http://127.0.0.1:{self.ports[key]}"

    @property
    def api_url(self) -> str:
        return self.url("api")

    @property
    def proxy_url(self) -> str:
        return self.url("proxy")

    @property
    def api_urls(self) -> list[str]:
        return [self.url(k) for k in self.ports if service_of(k) == "api"]

    @property
    def admin_key(self) -> str:
        """The key ``torpor up`` made for its operator."""
        return (self.data_dir / "admin-api-key").read_text().strip()

    def log(self, key: str) -> str:
        return (self.logs / f"{key}.log").read_text(errors="replace")

    def all_logs(self) -> str:
        return "\n".join(self.log(p.stem) for p in sorted(self.logs.glob("*.log")))

    def sdk_env(self, user: str = "alice") -> dict[str, str]:
        return {
            "E2B_API_KEY": self.keys[user],
            "E2B_API_URL": self.api_url,
            "E2B_SANDBOX_URL": self.proxy_url,
        }

    def sdk_opts(self, user: str = "alice") -> dict[str, Any]:
        """The same as keyword arguments of ``e2b.Sandbox``."""
        return {"api_key": self.keys[user], "api_url": self.api_url, "sandbox_url": self.proxy_url}

    def client(self, user: str, *, timeout: float = 90) -> httpx.Client:
        """The API as ``user`` (a bearer key, as the dashboard and the CLI send it)."""
        return httpx.Client(
            base_url=self.api_url,
            headers={"Authorization": f"Bearer {self.keys[user]}"},
            timeout=timeout,
        )

    def aclient(self, user: str, *, timeout: float = 120.0, index: int = 0) -> httpx.AsyncClient:
        """The E2B REST API of the ``index``-th api replica as ``user`` (``X-API-KEY``)."""
        urls = self.api_urls
        return httpx.AsyncClient(
            base_url=urls[index % len(urls)],
            headers={"X-API-KEY": self.keys[user]},
            timeout=timeout,
        )

    @contextlib.asynccontextmanager
    async def store(self) -> AsyncIterator[Any]:
        """A ``KvSandboxStore`` on the stack's bus: the records as the services see them."""
        from shared.bus.broker import key_value, make_broker
        from shared.bus.records import KvSandboxStore
        from shared.bus.topology import KV_SANDBOXES
        from shared.settings import BusSettings

        broker = make_broker(
            BusSettings(nats_url=self.nats_url, bus_provision=False), service="test"
        )
        await broker.connect()
        try:
            yield KvSandboxStore(await key_value(broker, KV_SANDBOXES))
        finally:
            await broker.stop()

    async def last_event(self, kind: str, sandbox_id: str, *, within: float = 10.0) -> Any:
        """The body of the last ``sandbox.evt.<kind>.<sandbox_id>`` on the bus (the api answers
        once the record changed; the event follows that CAS, so it may take a moment)."""
        from nats.js.errors import NotFoundError

        nc = await nats.connect(self.nats_url)
        try:
            deadline = time.monotonic() + within
            while True:
                with contextlib.suppress(NotFoundError):
                    msg = await nc.jetstream().get_last_msg(
                        "SANDBOX_EVT", f"sandbox.evt.{kind}.{sandbox_id}"
                    )
                    return json.loads(msg.data or b"{}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"no {kind} event of {sandbox_id}")
                await asyncio.sleep(0.1)
        finally:
            await nc.close()

    @contextlib.asynccontextmanager
    async def observer(self) -> AsyncIterator[LocalRuntime]:
        """A read-only view of the services' workloads (local runtime); on exit it stops every pod
        of the data dir (the services never stop pods, by design) so the test leaves nothing
        running. Stop the services first, or they start the pods again."""
        runtime = LocalRuntime(
            nats_url=self.nats_url,
            data_dir=self.data_dir,
            supervise=False,
            stop_pods_on_close=True,
        )
        await runtime.start()
        try:
            yield runtime
        finally:
            await runtime.close()

    # ------------------------------------------------------------ start and stop

    async def __aenter__(self) -> Stack:
        try:
            await (self._start_up() if self.mode == "up" else self._start_services())
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @contextlib.contextmanager
    def running(self) -> Iterator[Stack]:
        """``async with`` for synchronous code (a session fixture): no event loop may be running
        in this thread."""
        asyncio.run(self.__aenter__())
        try:
            yield self
        finally:
            asyncio.run(self.stop())

    async def _start_services(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        if self.templates is not None:
            self.templates_dir.mkdir(parents=True, exist_ok=True)
            for name, text in self.templates.items():
                (self.templates_dir / f"{name}.yaml").write_text(text)
        self.nats = EmbeddedNats(data_dir=self.root / "nats").start()
        if self.fast_redelivery:
            await provision_fast_redelivery(self.nats.url)
        if self.users:
            self.keys = await make_keys(
                self.nats.url, self.users, provision=not self.fast_redelivery
            )
        for replica in range(self.replicas):
            for name in self.services:
                self.start_service(name if replica == 0 else f"{name}-{replica}")
        await asyncio.gather(*(self.wait_ready(key) for key in self.procs))

    def service_env(self, key: str) -> dict[str, str]:
        env = clean_env(
            NATS_URL=self.nats_url,
            TORPOR_RUNTIME=self.runtime,
            TORPOR_DATA_DIR=str(self.data_dir),
            TORPOR_HEALTH_HOST="127.0.0.1",
            TORPOR_LOG_LEVEL=self.log_level,
            TORPOR_LOG_FORMAT=self.log_format,
            PAUSE_RESUME="true",
            PYTHONUNBUFFERED="1",
        )
        if self.templates is not None:
            env["TORPOR_TEMPLATES_DIR"] = str(self.templates_dir)
        own = self.env_of.get(service_of(key), {})
        # TORPOR_TUNING of the stack, of the test and of the service add up (a name given twice
        # stops the service).
        tuning = [self.env.get("TORPOR_TUNING", ""), own.get("TORPOR_TUNING", "")]
        if self.fast_redelivery:
            env |= {"TORPOR_BUS_PROVISION": "false", "TORPOR_READY_TIMEOUT": "30"}
            tuning.insert(0, "SCALER_HEARTBEAT_SECONDS=1,SNAPSHOTTER_HEARTBEAT_SECONDS=1")
        env |= self.env | own
        env["TORPOR_TUNING"] = ",".join(filter(None, tuning))
        port = self.ports[key]
        if service_of(key) in HTTP:
            env |= {
                "TORPOR_HOST": "127.0.0.1",
                "TORPOR_PORT": str(port),
                "TORPOR_HEALTH_PORT": str(free_port(avoid=self.ports.values())),
            }
        else:
            env["TORPOR_HEALTH_PORT"] = str(port)
        return env

    def start_service(self, key: str) -> None:
        """(Re)start one service replica (``scaler``, ``scaler-1``, …); it keeps its port across
        restarts. Wait for it with ``wait_ready``."""
        self.ports.setdefault(key, free_port(avoid=self.ports.values()))
        self.procs[key] = processes.spawn(
            ["run", service_of(key)], env=self.service_env(key), log=self.logs / f"{key}.log"
        )

    def health_url(self, key: str) -> str:
        path = "/health" if service_of(key) in HTTP else "/readyz"
        return self.url(key) + path

    async def wait_ready(self, key: str, timeout: float | None = None) -> None:
        try:
            await processes.await_http(
                self.health_url(key),
                self.procs[key],
                key,
                log=self.logs / f"{key}.log",
                timeout=self.ready_timeout if timeout is None else timeout,
            )
        except RuntimeError as e:
            raise StackDidNotStart(f"{e} (logs in {self.logs})") from e

    def alive(self, key: str) -> bool:
        return self.procs[key].poll() is None

    def kill9(self, key: str) -> None:
        if processes.kill9(self.procs[key]):
            self.kills += 1

    def dump_tasks(self) -> None:
        """Ask every live service to log its asyncio task stacks (``SIGUSR2``, for diagnosis)."""
        for proc in self.procs.values():
            processes.signal_group(proc, signal.SIGUSR2)

    async def restart_nats(self) -> None:
        """The same server again: same port, same store."""
        assert self.nats is not None
        await asyncio.to_thread(self.nats.restart)

    def stop_services(self) -> None:
        """Every service (SIGTERM, then SIGKILL); the pods stay."""
        if self.mode == "up":  # its own shutdown, as Ctrl-C starts it
            processes.stop(self.procs.values(), sig=signal.SIGINT, grace=40, group=False)
        else:
            processes.stop(self.procs.values())
        for pid in daemon_pids(self.data_dir):  # a SIGSTOPped daemon cannot die until continued
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    async def stop(self) -> None:
        """Services, then pods and their network, then the bus."""
        await asyncio.to_thread(self.stop_services)
        kill_pods(self.data_dir)
        # torpor up does these, unless it was killed (a pod still dying: unmounted lazily).
        await asyncio.to_thread(unmount_stopped, self.data_dir)
        await release_instance(self.data_dir)
        if self.nats is not None:
            self.nats.stop()

    # ------------------------------------------------------------ torpor up

    async def _start_up(self, timeout: float = 120) -> None:
        api, proxy = free_ports(2, avoid=self.ports.values())
        self.ports |= {"api": api, "proxy": proxy}
        self.procs["up"] = processes.spawn(
            up_args(self.data_dir, self.ports["api"], self.ports["proxy"]),
            env=cli_env(**{"TORPOR_LOG_FORMAT": self.log_format, **self.env}),
            log=self.root / "logs" / "up.log",
        )
        state = self.data_dir / "torpor.json"
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=1, trust_env=False) as http:
            while not self._nats_url:
                if not self.alive("up"):
                    msg = f"torpor up exited with {self.procs['up'].returncode}"
                    raise StackDidNotStart(msg)
                if time.monotonic() > deadline:
                    msg = f"torpor up was not ready within {timeout}s"
                    raise StackDidNotStart(msg)
                if state.exists():
                    with contextlib.suppress(httpx.HTTPError):
                        if (await http.get(f"{self.api_url}/health")).status_code == 200:
                            self._nats_url = json.loads(state.read_text())["nats_url"]
                            continue
                await asyncio.sleep(0.3)
        # As the operator (``torpor keys`` on this instance would be the same user).
        bus = operator_bus(self._nats_url, read_credentials(self.data_dir / "nats"))
        self.keys = await make_keys(bus, self.users, provision=False)


def up_args(data_dir: Path, api_port: int, proxy_port: int) -> list[str]:
    """``torpor up`` on the given loopback ports with a NATS port the system picks."""
    return [
        "up",
        "--data-dir",
        str(data_dir),
        "--api-port",
        str(api_port),
        "--proxy-port",
        str(proxy_port),
        "--nats-port",
        "0",
    ]
