"""Cost of the HTTP guard on the hot path, without the network: uvicorn's httptools protocol vs
torpor's guarded subclass (shared/web/protocol.py), each fed the same keep-alive GET requests
through an in-memory transport to a trivial ASGI app, plus the per-request ASGI work the proxy
adds (in-flight count per client). CPU time per request, interleaved rounds, median.

    .venv/bin/python bench/http_guard_bench.py [--requests 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import uvicorn  # noqa: E402
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # noqa: E402
from uvicorn.server import ServerState  # noqa: E402

from shared.web.limits import HttpLimits  # noqa: E402
from shared.web.protocol import guarded_protocol  # noqa: E402
from shared.web.requests import InFlight  # noqa: E402

REQUEST = (
    b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:3001\r\nE2b-Sandbox-Id: isandbox\r\n"
    b"E2b-Sandbox-Port: 49983\r\nX-Access-Token: 0123456789abcdef\r\nAccept: */*\r\n"
    b"User-Agent: e2b-python-sdk/2.63.0\r\n\r\n"
)


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 3001)}.get(
            name, default
        )

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += 1

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def make_app(in_flight: InFlight | None) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if in_flight is not None:  # as services/proxy/app.py does
            client = in_flight.acquire(scope)
            try:
                await _answer(send)
            finally:
                in_flight.release(client)
        else:
            await _answer(send)

    return app


async def _answer(send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def run(protocol_class: type[HttpToolsProtocol], app: Any, n: int) -> float:
    config = uvicorn.Config(app, http=protocol_class, log_config=None, lifespan="off")
    config.load()
    state = ServerState()
    proto = protocol_class(config=config, server_state=state, app_state={})
    transport = Transport()
    proto.connection_made(transport)
    started = time.process_time()
    for _ in range(n):
        proto.data_received(REQUEST)
        while state.tasks:
            await asyncio.gather(*list(state.tasks))
    elapsed = time.process_time() - started
    assert transport.written >= n, "responses missing"
    proto.connection_lost(None)
    return elapsed / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    limits = HttpLimits()
    cases = {
        "uvicorn httptools": (HttpToolsProtocol, make_app(None)),
        "guarded protocol": (guarded_protocol(limits), make_app(None)),
        "guarded + in-flight": (guarded_protocol(limits), make_app(InFlight(512))),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):  # interleaved: load changes hit both alike
        for name, (cls, app) in cases.items():
            samples[name].append(asyncio.run(run(cls, app, args.requests)))
    rows = {name: statistics.median(v) for name, v in samples.items()}
    base = rows["uvicorn httptools"]
    for name, us in rows.items():
        print(f"{name:<22} {us:7.1f} CPU us/request  ({us - base:+.1f})")
    out = REPO / "bench" / "results" / "http_guard.json"
    out.write_text(
        json.dumps(
            {"cpu_us_per_request": rows, "requests": args.requests, "rounds": args.rounds}, indent=2
        )
        + "\n"
    )
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
