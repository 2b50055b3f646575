"""``torpor up`` as a real process on free loopback ports with a temp data dir, plus API keys for
alice, bob and an admin (root). Shared by tests/dashboard and tests/cli_sandbox.

``PAUSE_RESUME=alice``: alice's autoPause sandboxes pause on expiry, bob's are killed, and the
admin view has one user of each kind to show."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from shared.bus.server import free_port
from shared.runtime.local.network import release_instance

REPO = Path(__file__).resolve().parents[2]
TORPOR = [sys.executable, "-m", "services.cli"]
PAUSE_RESUME = "alice"
# Seeds the sandbox's /workspace with nothing; the packaged sandbox-base template is used.


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORPOR_", "E2B_", "NATS_")) and k != "PAUSE_RESUME"
    }
    env.update({"PYTHONUNBUFFERED": "1", "COLUMNS": "200", "NO_COLOR": "1"})
    env.update(extra)
    return env


@dataclass
class Up:
    data_dir: Path
    api_url: str
    proxy_url: str
    nats_url: str
    proc: subprocess.Popen[bytes]
    keys: dict[str, str] = field(default_factory=dict)

    @property
    def admin_key(self) -> str:
        return (self.data_dir / "admin-api-key").read_text().strip()

    def log(self, service: str) -> str:
        path = self.data_dir / "logs" / f"{service}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def all_logs(self) -> str:
        return "\n".join(
            self.log(s) for s in ("api", "proxy", "scheduler", "snapshotter", "scaler")
        )

    def sdk_env(self, user: str) -> dict[str, str]:
        return {
            "E2B_API_URL": self.api_url,
            "E2B_SANDBOX_URL": self.proxy_url,
            "E2B_API_KEY": self.keys[user],
        }

    def client(self, user: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.api_url,
            headers={"Authorization": f"Bearer {self.keys[user]}"},
            timeout=90,
        )


def _wait(up: Up, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    state = up.data_dir / "torpor.json"
    while time.monotonic() < deadline:
        if up.proc.poll() is not None:
            msg = f"torpor up exited with {up.proc.returncode}"
            raise RuntimeError(msg)
        if state.exists():
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{up.api_url}/health", timeout=1).status_code == 200:
                    up.nats_url = json.loads(state.read_text())["nats_url"]
                    return
        time.sleep(0.3)
    msg = f"torpor up was not ready within {timeout}s"
    raise RuntimeError(msg)


def _key(up: Up, user: str, *, admin: bool = False) -> str:
    args = [*TORPOR, "keys", "create", user, "--data-dir", str(up.data_dir)]
    out = subprocess.run(
        [*args, "--admin"] if admin else args,
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=REPO,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def _kill_pods(root: Path) -> None:
    """bwrap pods of this instance (their command line mentions our data dir)."""
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
def torpor_up(
    root: Path, *, timeout: float = 120, data_dir: Path | None = None, **env: str
) -> Iterator[Up]:
    """``env``: extra settings for the instance (e.g. ``TORPOR_LOG_FORMAT="console"``);
    ``data_dir``: another instance's data dir (a restart), else ``root/data``."""
    data_dir = data_dir or root / "data"
    api_port, proxy_port = free_port(), free_port()
    (root / "logs").mkdir(parents=True, exist_ok=True)
    out = (root / "logs" / "up.log").open("wb")
    proc = subprocess.Popen(
        [
            *TORPOR,
            "up",
            "--data-dir",
            str(data_dir),
            "--api-port",
            str(api_port),
            "--proxy-port",
            str(proxy_port),
            "--nats-port",
            "0",
        ],
        cwd=REPO,
        env=clean_env(
            PAUSE_RESUME=PAUSE_RESUME,
            TORPOR_STOP_GRACE="10",
            **{"TORPOR_LOG_FORMAT": "json", **env},
        ),
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    up = Up(
        data_dir=data_dir,
        api_url=f"http://127.0.0.1:{api_port}",
        proxy_url=f"http://127.0.0.1:{proxy_port}",
        nats_url="",
        proc=proc,
    )
    try:
        _wait(up, timeout)
        up.keys = {
            "alice": _key(up, "alice"),
            "bob": _key(up, "bob"),
            "root": _key(up, "root", admin=True),
        }
        yield up
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        out.close()
        _kill_pods(data_dir)
        asyncio.run(release_instance(data_dir))  # torpor up did, unless it was killed


def need_up() -> str | None:
    """Why ``torpor up`` cannot run the local runtime here, or ``None``."""
    import shutil

    return None if shutil.which("bwrap") else "bubblewrap (bwrap) is not installed"
