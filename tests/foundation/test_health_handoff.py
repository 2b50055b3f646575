"""``torpor up`` holds each worker's health port for its whole run and hands the listening
socket to every run of the service (``TORPOR_HEALTH_FD``): no other process can take the port
between the pick and a start, or while a service restarts (it used to pick a free port and let
the service bind it later). Real processes: the supervisor, the real scheduler, a nats-server.
A bad ``TORPOR_HEALTH_FD`` is one readable line and exit 2."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest

from services.cli.catalog import by_name
from services.cli.probing import http_status
from services.cli.supervising import Child, Supervisor
from shared.bus.server import listeners
from tests.support.env import clean_env

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]


def _taken(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


async def _until(check: object, within: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await check():  # type: ignore[operator]
        assert loop.time() < deadline, "not within the time"
        await asyncio.sleep(0.1)


async def test_a_restarting_worker_keeps_its_health_port(nats_url: str, tmp_path: Path) -> None:
    [sock] = listeners(1)
    port = int(sock.getsockname()[1])
    child = Child(spec=by_name("scheduler"), health_port=port, health_socket=sock)
    supervisor = Supervisor(
        children=[child],
        env=clean_env(NATS_URL=nats_url, TORPOR_LOG_LEVEL="warning"),
        log_dir=tmp_path / "logs",
        backoff_base=2.0,  # a restart that takes a while: the port must stay held meanwhile
    )
    stop = asyncio.Event()
    running = asyncio.create_task(supervisor.run(stop))
    try:

        async def live() -> bool:
            return await http_status("127.0.0.1", port, "/livez") == 200

        await _until(live)
        first = child.pid
        assert first is not None and _taken(port)
        os.killpg(first, signal.SIGKILL)

        async def restarting() -> bool:
            return child.state == "restarting"

        await _until(restarting)
        assert _taken(port)  # no service runs, yet nobody else can bind the port

        async def back() -> bool:
            return child.pid != first and await live()

        await _until(back)
        assert child.restarts == 1 and child.health_port == port
    finally:
        stop.set()
        await running
        sock.close()
    assert not _taken(port)  # given back once torpor up is gone


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("not-a-number", "health_fd"),
        ("1", "health_fd"),  # stdout: never taken for a socket
        ("999", "TORPOR_HEALTH_FD=999: not an open socket"),
        ("file", "not an open socket"),
        ("udp", "not a listening TCP socket"),
        ("bound", "not a listening TCP socket"),  # bound, not listening
    ],
)
def test_a_bad_health_fd_is_one_line_and_exit_2(value: str, says: str, tmp_path: Path) -> None:
    handed: list[int] = []
    keep: list[IO[str] | socket.socket] = []
    if value == "file":
        f = open(tmp_path / "f", "w")
        keep.append(f)
        handed.append(f.fileno())
    elif value in ("udp", "bound"):
        s = socket.socket(type=socket.SOCK_DGRAM if value == "udp" else socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        keep.append(s)
        handed.append(s.fileno())
    fd = str(handed[0]) if handed else value
    try:
        done = subprocess.run(
            [sys.executable, "-m", "services.cli", "run", "scheduler"],
            cwd=REPO,
            check=False,
            env=clean_env(NATS_URL="nats://127.0.0.1:1", TORPOR_HEALTH_FD=fd),
            pass_fds=handed,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        for k in keep:
            k.close()
    assert done.returncode == 2, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("torpor scheduler: "), done.stderr
    assert says in lines[0]
