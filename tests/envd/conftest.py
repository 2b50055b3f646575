"""Fixtures: the daemon as a plain subprocess on 127.0.0.1 and the unmodified e2b SDK against it.

A minimal control-plane stand-in answers the SDK's create/connect calls (docs/api.md) with a
sandbox id, envdVersion and envdAccessToken; ``E2B_SANDBOX_URL`` points the SDK at the daemon.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.support.processes import terminate

REPO = Path(__file__).resolve().parents[2]
TOKEN = "test-envd-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Daemon:
    url: str
    port: int
    root: Path
    token: str | None
    proc: subprocess.Popen[bytes]
    log: Path


def start_daemon(
    root: Path,
    log: Path,
    token: str | None = TOKEN,
    extra: tuple[str, ...] = (),
    prefix: tuple[str, ...] = (),
) -> Daemon:
    """``prefix``: what the daemon runs under (bubblewrap, for a PID namespace of its own)."""
    port = free_port()
    args = [
        *prefix,
        sys.executable,
        "-m",
        "services.envd",
        "--listen",
        f"127.0.0.1:{port}",
        "--root",
        str(root),
        "--log-level",
        "info",
    ]
    if token:
        args += ["--access-token", token]
    args += extra
    env = {k: v for k, v in os.environ.items() if k != "ENVD_ACCESS_TOKEN"}
    with log.open("wb") as fh:
        proc = subprocess.Popen(args, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"envd exited: {log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 204:
                return Daemon(url, port, root, token, proc, log)
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"envd did not become healthy: {log.read_text()}")


def stop_daemon(daemon: Daemon) -> None:
    terminate(daemon.proc)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("envd-root")
    d = start_daemon(root, root.parent / f"{root.name}.log")
    yield d
    stop_daemon(d)


class _ControlPlane(BaseHTTPRequestHandler):
    token: str | None = TOKEN

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _reply(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _sandbox(self, sandbox_id: str) -> dict[str, object]:
        body: dict[str, object] = {
            "templateID": "sandbox-base",
            "sandboxID": sandbox_id,
            "clientID": "client",
            "envdVersion": ENVD_VERSION,
        }
        if self.token:
            body["envdAccessToken"] = self.token
        return body

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if self.path == "/v2/sandboxes":
            self._reply(201, self._sandbox("sbx-test"))
        elif self.path.startswith("/v2/sandboxes/") and self.path.endswith("/connect"):
            self._reply(200, self._sandbox(self.path.split("/")[3]))
        else:
            self._reply(404, {"code": 404, "message": "not found"})

    def do_DELETE(self) -> None:
        self.send_response(204)
        self.end_headers()


# The version the daemon reports; the stand-in hands it to the SDK like the control plane will.
from services.envd.version import ENVD_VERSION  # noqa: E402


@contextlib.contextmanager
def _serving(plane: type[_ControlPlane]) -> Iterator[str]:
    """``plane`` on a loopback port in a thread: its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), plane)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def control_plane() -> Iterator[str]:
    with _serving(_ControlPlane) as url:
        yield url


class _WrongTokenPlane(_ControlPlane):
    token = "not-the-daemons-token"


@pytest.fixture(scope="module")
def wrong_token_plane() -> Iterator[str]:
    with _serving(_WrongTokenPlane) as url:
        yield url


@pytest.fixture(scope="module")
def sdk_opts(daemon: Daemon, control_plane: str) -> dict[str, str]:
    return {"api_key": "test-key", "api_url": control_plane, "sandbox_url": daemon.url}


@pytest.fixture(scope="module")
def sbx(sdk_opts: dict[str, str]):  # type: ignore[no-untyped-def]
    from e2b import Sandbox

    return Sandbox.create(template="sandbox-base", **sdk_opts)
