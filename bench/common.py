"""Shared helpers of the benchmarks: statistics, result files, and a whole torpor stack on free
loopback ports in a temporary directory.

``TorporStack`` starts a private nats-server, an API key for the user ``bench``, then every service
as its own process (``python -m services.cli run <name>``, exactly what ``torpor up`` supervises)
with ``replicas`` copies of each. On the local runtime the pods are bubblewrap process trees; with
``runtime="kubernetes"`` the services talk to the kube-apiserver whose kubeconfig is given (the
test rig of ``tests/k8s``). Everything listens on and dials 127.0.0.0/8 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from shared.bus.server import EmbeddedNats, free_port  # noqa: E402
from shared.logging import configure  # noqa: E402
from shared.runtime.local.network import release_instance  # noqa: E402
from shared.settings import LoggingSettings  # noqa: E402

# The benchmark's own runtime and envd clients log at warning: the figures are the output.
configure(LoggingSettings(log_level="warning"), service="bench")

RESULTS = REPO / "bench" / "results"
SERVICES = ("api", "proxy", "scheduler", "snapshotter", "scaler")
USER = "bench"

# ---------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100): p99 of 100 samples is the 99th smallest."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def summary(seconds: Sequence[float]) -> dict[str, float]:
    """Milliseconds: n, p50, p90, p99, min, max, mean."""
    if not seconds:
        return {"n": 0}
    return {
        "n": len(seconds),
        "p50_ms": round(percentile(seconds, 50) * 1000, 1),
        "p90_ms": round(percentile(seconds, 90) * 1000, 1),
        "p99_ms": round(percentile(seconds, 99) * 1000, 1),
        "min_ms": round(min(seconds) * 1000, 1),
        "max_ms": round(max(seconds) * 1000, 1),
        "mean_ms": round(statistics.fmean(seconds) * 1000, 1),
    }


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("nan")


# ---------------------------------------------------------------- machine and results


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict[str, Any]:
    mem_kib = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    return {
        "cpus": os.cpu_count(),
        "mem_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "loadavg": loadavg(),
    }


def write_result(name: str, data: dict[str, Any]) -> Path:
    """``bench/results/<name>.json`` with the machine, its load and the time added."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    doc = {
        "benchmark": name,
        **data,
        "machine": machine(),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *([_cell(c) for c in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3f}".rstrip("0").rstrip(".")
    return str(value)


def stats_row(label: str, stats: dict[str, float]) -> list[object]:
    return [
        label,
        stats.get("n", 0),
        stats.get("p50_ms", ""),
        stats.get("p90_ms", ""),
        stats.get("p99_ms", ""),
        stats.get("max_ms", ""),
    ]


STATS_HEADERS = ("measurement", "n", "p50 ms", "p90 ms", "p99 ms", "max ms")


# ---------------------------------------------------------------- a whole stack


@dataclass
class TorporStack:
    """Start with ``async with TorporStack(...) as stack``; see the module docstring."""

    replicas: int = 1
    runtime: str = "local"
    env: dict[str, str] = field(default_factory=dict)
    # TORPOR_BENCH_LOG_LEVEL=info (with TORPOR_BENCH_KEEP=1) to look into a slow cycle.
    log_level: str = field(
        default_factory=lambda: os.environ.get("TORPOR_BENCH_LOG_LEVEL", "warning")
    )
    root: Path | None = None
    nats: EmbeddedNats | None = None
    api_urls: list[str] = field(default_factory=list)
    proxy_urls: list[str] = field(default_factory=list)
    api_key: str = ""
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _owns_root: bool = False

    @property
    def api_url(self) -> str:
        return self.api_urls[0]

    @property
    def proxy_url(self) -> str:
        return self.proxy_urls[0]

    @property
    def nats_url(self) -> str:
        assert self.nats is not None
        return self.nats.url

    @property
    def data_dir(self) -> Path:
        assert self.root is not None
        return self.root / "data"

    async def __aenter__(self) -> TorporStack:
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="torpor-bench-"))
            self._owns_root = True
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        self.nats = EmbeddedNats(data_dir=self.root / "nats").start()
        try:
            self.api_key = await _make_key(self.nats.url)
            for i in range(self.replicas):
                for name in SERVICES:
                    self.start(name, i)
            await self._wait_all_ready()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    def base_env(self) -> dict[str, str]:
        assert self.root is not None
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("TORPOR_", "E2B_", "NATS_"))
        }
        env.update(
            {
                "NATS_URL": self.nats_url,
                "TORPOR_DATA_DIR": str(self.data_dir),
                "TORPOR_RUNTIME": self.runtime,
                "TORPOR_HEALTH_HOST": "127.0.0.1",
                "TORPOR_LOG_LEVEL": self.log_level,
                "PAUSE_RESUME": "true",
                "PYTHONUNBUFFERED": "1",
                **self.env,
            }
        )
        return env

    def start(self, name: str, replica: int = 0) -> None:
        """(Re)start one service replica; api and proxy replicas keep their port across restarts."""
        assert self.root is not None
        key = f"{name}-{replica}"
        env = self.base_env()
        port_file = self.root / f"{key}.port"
        port = int(port_file.read_text()) if port_file.exists() else free_port()
        port_file.write_text(str(port))
        if name in ("api", "proxy"):
            env.update({"TORPOR_HOST": "127.0.0.1", "TORPOR_PORT": str(port)})
            urls = self.api_urls if name == "api" else self.proxy_urls
            url = f"http://127.0.0.1:{port}"
            if url not in urls:
                urls.append(url)
        env["TORPOR_HEALTH_PORT"] = str(port if name not in ("api", "proxy") else free_port())
        with (self.root / "logs" / f"{key}.log").open("ab") as log:
            self.procs[key] = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "run", name],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill9(self, key: str) -> None:
        proc = self.procs[key]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def health_url(self, key: str) -> str:
        assert self.root is not None
        port = int((self.root / f"{key}.port").read_text())
        path = "/health" if key.startswith(("api", "proxy")) else "/readyz"
        return f"http://127.0.0.1:{port}{path}"

    async def wait_ready(self, key: str, timeout: float | None = None) -> None:
        # TORPOR_BENCH_READY_TIMEOUT: services import slowly on a heavily loaded machine
        if timeout is None:
            timeout = float(os.environ.get("TORPOR_BENCH_READY_TIMEOUT", "90"))
        url = self.health_url(key)
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=2) as http:
            while time.monotonic() < deadline:
                proc = self.procs[key]
                if proc.poll() is not None:
                    msg = f"{key} exited with {proc.returncode}; see {self.root}/logs/{key}.log"
                    raise RuntimeError(msg)
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(url)).status_code == 200:
                        return
                await asyncio.sleep(0.2)
        msg = f"{key} not ready at {url} within {timeout}s"
        raise RuntimeError(msg)

    async def _wait_all_ready(self) -> None:
        await asyncio.gather(*(self.wait_ready(key) for key in self.procs))

    async def __aexit__(self, *exc: object) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for key, proc in self.procs.items():
            try:
                await asyncio.to_thread(proc.wait, 15)
            except subprocess.TimeoutExpired:
                self.kill9(key)
        if self.root is not None:
            kill_pods(self.root)
            await release_instance(self.data_dir)
        if self.nats is not None:
            self.nats.stop()
        if self._owns_root and self.root is not None:
            if os.environ.get("TORPOR_BENCH_KEEP"):  # keep logs for a post-mortem
                print(f"kept {self.root}", file=sys.stderr)
            else:
                shutil.rmtree(self.root, ignore_errors=True)

    def client(self, *, timeout: float = 120.0, index: int = 0) -> httpx.AsyncClient:
        """An E2B REST client of the ``index``-th API replica (``X-API-KEY``)."""
        url = self.api_urls[index % len(self.api_urls)]
        return httpx.AsyncClient(base_url=url, headers={"X-API-KEY": self.api_key}, timeout=timeout)

    @contextlib.asynccontextmanager
    async def store(self) -> AsyncIterator[Any]:
        """A ``KvSandboxStore`` on the stack's bus (the benchmark's view of the records)."""
        from shared.bus.broker import key_value, make_broker
        from shared.bus.records import KvSandboxStore
        from shared.bus.topology import KV_SANDBOXES
        from shared.settings import BusSettings

        broker = make_broker(
            BusSettings(nats_url=self.nats_url, bus_provision=False), service="bench"
        )
        await broker.connect()
        try:
            yield KvSandboxStore(await key_value(broker, KV_SANDBOXES))
        finally:
            await broker.stop()


async def _make_key(nats_url: str) -> str:
    from shared.auth.keys import KvApiKeys, KvUsers
    from shared.bus.broker import key_value, make_broker, prepare
    from shared.bus.kv import NatsBucket
    from shared.bus.topology import KV_API_KEYS, KV_USERS
    from shared.settings import BusSettings

    bus = BusSettings(nats_url=nats_url)
    broker = make_broker(bus, service="bench")
    await prepare(broker, bus)
    try:
        users = KvUsers(NatsBucket(await key_value(broker, KV_USERS)))
        keys = KvApiKeys(NatsBucket(await key_value(broker, KV_API_KEYS)), users)
        return (await keys.create(USER, admin=False))[1]
    finally:
        await broker.stop()


def pods_of(root: Path) -> list[int]:
    """Pids of bwrap pods whose command line mentions ``root`` (this stack's data dir)."""
    marker = str(root).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline and b"bwrap" in cmdline.split(b"\0", 1)[0]:
            found.append(int(entry.name))
    return found


def kill_pods(root: Path) -> None:
    for pid in pods_of(root):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- E2B REST calls


async def create_sandbox(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    r = await http.post("/sandboxes", json={"templateID": "sandbox-base", "timeout": 3600, **body})
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]


async def pause(http: httpx.AsyncClient, sandbox_id: str) -> None:
    r = await http.post(f"/sandboxes/{sandbox_id}/pause")
    if r.status_code != 204:
        msg = f"pause {sandbox_id}: {r.status_code} {r.text[:300]}"
        raise RuntimeError(msg)


async def connect(http: httpx.AsyncClient, sandbox_id: str, *, timeout: int = 3600) -> int:
    r = await http.post(f"/sandboxes/{sandbox_id}/connect", json={"timeout": timeout})
    if r.status_code not in (200, 201):
        msg = f"connect {sandbox_id}: {r.status_code} {r.text[:300]}"
        raise RuntimeError(msg)
    return r.status_code


async def kill(http: httpx.AsyncClient, sandbox_id: str) -> None:
    r = await http.delete(f"/sandboxes/{sandbox_id}")
    if r.status_code not in (204, 404):
        msg = f"kill {sandbox_id}: {r.status_code} {r.text[:300]}"
        raise RuntimeError(msg)
