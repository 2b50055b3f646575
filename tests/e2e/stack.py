"""The whole system for end-to-end tests: a real nats-server, then api, proxy, scheduler,
snapshotter and scaler as separate processes (``python -m services.cli run <name>``) on the
local (bubblewrap) runtime. Logs go to files so tests can read them (e.g. for leaked keys)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from shared.bus.server import EmbeddedNats, free_port
from shared.runtime.local.network import release_instance
from shared.settings import BusSettings

SERVICES = ("api", "proxy", "scheduler", "snapshotter", "scaler")
REPO = Path(__file__).resolve().parents[2]

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


@dataclass
class Stack:
    root: Path
    api_url: str
    proxy_url: str
    nats_url: str
    keys: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def log(self, name: str) -> str:
        return (self.root / "logs" / f"{name}.log").read_text(errors="replace")

    def all_logs(self) -> str:
        return "\n".join(
            self.log(n) for n in SERVICES if (self.root / "logs" / f"{n}.log").exists()
        )

    def sdk_env(self, user: str = "alice") -> dict[str, str]:
        return {
            "E2B_API_KEY": self.keys[user],
            "E2B_API_URL": self.api_url,
            "E2B_SANDBOX_URL": self.proxy_url,
        }


async def _make_keys(nats_url: str, users: dict[str, bool]) -> dict[str, str]:
    from shared.auth.keys import KvApiKeys, KvUsers
    from shared.bus.broker import key_value, make_broker, prepare
    from shared.bus.kv import NatsBucket
    from shared.bus.topology import KV_API_KEYS, KV_USERS

    bus = BusSettings(nats_url=nats_url)
    broker = make_broker(bus, service="e2e")
    await prepare(broker, bus)
    try:
        users_store = KvUsers(NatsBucket(await key_value(broker, KV_USERS)))
        keys = KvApiKeys(NatsBucket(await key_value(broker, KV_API_KEYS)), users_store)
        return {name: (await keys.create(name, admin=admin))[1] for name, admin in users.items()}
    finally:
        await broker.stop()


def _wait_http(
    url: str, proc: subprocess.Popen[bytes], name: str, log: Path, timeout: float = 180
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            last = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            msg = f"{name} exited with {proc.returncode} while starting: {last[0][:300]}"
            raise RuntimeError(msg)
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    msg = f"{name} not ready at {url} within {timeout}s"
    raise RuntimeError(msg)


def _kill_pods(root: Path) -> None:
    """bwrap pods of this stack's runtime (found by our data dir on their command line)."""
    marker = str(root).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline and b"bwrap" in cmdline.split(b"\0", 1)[0]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)


@contextlib.contextmanager
def running_stack(root: Path, *, env: dict[str, str] | None = None) -> Iterator[Stack]:
    (root / "logs").mkdir(parents=True, exist_ok=True)
    templates = root / "templates"
    templates.mkdir(exist_ok=True)
    (templates / "sandbox-base.yaml").write_text(SEED_TEMPLATE)
    nats = EmbeddedNats(data_dir=root / "nats").start()
    api_port, proxy_port = free_port(), free_port()
    stack = Stack(
        root=root,
        api_url=f"http://127.0.0.1:{api_port}",
        proxy_url=f"http://127.0.0.1:{proxy_port}",
        nats_url=nats.url,
    )
    try:
        stack.keys = asyncio.run(_make_keys(nats.url, {"alice": False, "bob": False, "root": True}))
        base = {
            k: v for k, v in os.environ.items() if not k.startswith(("TORPOR_", "E2B_", "NATS_"))
        }
        base.update(
            {
                "NATS_URL": nats.url,
                "TORPOR_DATA_DIR": str(root / "data"),
                "TORPOR_TEMPLATES_DIR": str(templates),
                "TORPOR_RUNTIME": "local",
                "TORPOR_HEALTH_HOST": "127.0.0.1",
                "TORPOR_LOG_FORMAT": "json",
                "TORPOR_LOG_LEVEL": "debug",
                "PAUSE_RESUME": "true",
                "PYTHONUNBUFFERED": "1",
                **(env or {}),
            }
        )
        health: dict[str, int] = {}
        for name in SERVICES:
            proc_env = dict(base)
            if name == "api":
                proc_env.update({"TORPOR_HOST": "127.0.0.1", "TORPOR_PORT": str(api_port)})
            elif name == "proxy":
                proc_env.update({"TORPOR_HOST": "127.0.0.1", "TORPOR_PORT": str(proxy_port)})
            else:
                health[name] = free_port()
                proc_env["TORPOR_HEALTH_PORT"] = str(health[name])
            out = (root / "logs" / f"{name}.log").open("wb")
            stack.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "run", name],
                cwd=REPO,
                env=proc_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        logs = root / "logs"
        _wait_http(f"{stack.api_url}/health", stack.procs["api"], "api", logs / "api.log")
        _wait_http(f"{stack.proxy_url}/health", stack.procs["proxy"], "proxy", logs / "proxy.log")
        for name, port in health.items():
            url = f"http://127.0.0.1:{port}/readyz"
            _wait_http(url, stack.procs[name], name, logs / f"{name}.log")
        yield stack
    finally:
        for proc in stack.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in stack.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        _kill_pods(root)
        asyncio.run(release_instance(root / "data"))  # the pods' namespaces, links and rules
        nats.stop()


def need_bwrap() -> str | None:
    return None if shutil.which("bwrap") else "bubblewrap (bwrap) is not installed"
