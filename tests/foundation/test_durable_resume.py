"""A worker killed with SIGKILL and started again resumes its durable consumer: nothing published
while it was down, and nothing it was handling when it died, is lost."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nats

from shared.bus.server import EmbeddedNats
from shared.bus.topology import STREAM_EVT, ensure_topology
from tests.foundation.durables import TEST_DURABLE
from tests.support.processes import terminate

WORKER = Path(__file__).with_name("durable_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _start(url: str, out: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, str(WORKER), url, str(out)], env=env, cwd=ROOT)


async def _wait_for(out: Path, line: str, timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = out.read_text().splitlines() if out.exists() else []
        if line in lines:
            return lines
        await asyncio.sleep(0.1)
    msg = f"{line!r} not seen in {out}: {lines}"
    raise AssertionError(msg)


async def _wait_started(out: Path, proc: subprocess.Popen[bytes]) -> None:
    await _wait_for(out, f"started:{proc.pid}")


async def test_killed_worker_resumes_durable(fresh_nats: EmbeddedNats, tmp_path: Path) -> None:
    out = tmp_path / "handled.txt"
    nc = await nats.connect(fresh_nats.url)
    js = nc.jetstream()
    await ensure_topology(js)
    await js.add_consumer(TEST_DURABLE.stream, TEST_DURABLE.config())

    async def publish(body: str) -> None:
        await js.publish(f"sandbox.evt.activity.{body}", body.encode(), stream=STREAM_EVT)

    worker = _start(fresh_nats.url, out)
    try:
        await _wait_started(out, worker)
        for i in range(3):
            await publish(f"m{i}")
        await _wait_for(out, "done:m2")
        await publish("hold1")
        await _wait_for(out, "holding:hold1")
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        for i in range(3, 6):  # published while no worker runs
            await publish(f"m{i}")

        worker = _start(fresh_nats.url, out)
        await _wait_started(out, worker)
        lines = await _wait_for(out, "done:hold1")
        lines = await _wait_for(out, "done:m5")
        done = {line.removeprefix("done:") for line in lines if line.startswith("done:")}
        assert done == {"m0", "m1", "m2", "m3", "m4", "m5", "hold1"}
        info = await js.consumer_info(TEST_DURABLE.stream, TEST_DURABLE.name)
        assert info.num_pending == 0
        await asyncio.sleep(0.5)
        assert (
            info.num_ack_pending == 0
            or (await js.consumer_info(TEST_DURABLE.stream, TEST_DURABLE.name)).num_ack_pending == 0
        )
    finally:
        terminate(worker)
        await nc.close()
