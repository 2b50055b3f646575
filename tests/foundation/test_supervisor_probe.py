"""The supervisor of ``torpor up`` (services/cli/supervising.py) probes each service's /readyz:
a service marked "not ready" (slow to start) is probed again and becomes "ready" once it answers
200 (CI: the scheduler was never probed again after 10 s of not ready, and stayed so)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from services.cli.catalog import ServiceSpec
from services.cli.supervising import Child, Supervisor


class Alive:
    returncode = None  # a running process, as the probe sees it


async def test_a_service_not_ready_at_first_is_probed_until_ready(tmp_path: Path) -> None:
    answers = iter([503, 503, 503])  # then 200 for good

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        status = next(answers, 200)
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n".encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    child = Child(spec=ServiceSpec("scheduler"), health_port=port)
    child.process = Alive()  # type: ignore[assignment]
    child.state = "starting"
    child.started_at = time.monotonic() - 11  # past the 10 s grace: a 503 reads "not ready"
    seen: list[str] = []

    def notify(event: str, c: Any, detail: str) -> None:
        seen.append(event)

    supervisor = Supervisor(children=[child], env={}, log_dir=tmp_path, notify=notify)
    probe = asyncio.create_task(supervisor._probe())
    try:
        for _ in range(100):
            if child.state == "ready":
                break
            await asyncio.sleep(0.1)
    finally:
        supervisor._stopping = True
        supervisor._stopped.set()
        await probe
        server.close()
        await server.wait_closed()
    assert seen == ["not ready", "ready"]
    assert child.state == "ready"
