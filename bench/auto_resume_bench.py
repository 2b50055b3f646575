"""Auto-resume through the proxy: the first request to a paused sandbox, and a burst of concurrent
requests to one paused sandbox (they must share one resume and none may fail).

    .venv/bin/python bench/auto_resume_bench.py [--rounds 20] [--burst 32]

Whole stack on the local runtime. Sandboxes are created with ``autoResume`` and run two
background processes. Each round pauses the sandbox through the API, then:

- single: one ``GET /health`` to the daemon through the proxy (``E2b-Sandbox-Id`` header) is
  timed from send to response (resume + replay + the forwarded request);
- burst: ``--burst`` such requests at once; reports the slowest, the error count, and how many
  resumes happened (the record's generation moves by exactly 1 for one resume, and the
  ``sandbox.evt.resumed`` events of the round are counted).

Writes ``bench/results/auto_resume.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import httpx
from common import (
    STATS_HEADERS,
    USER,
    Stack,
    create_sandbox,
    loadavg,
    pause,
    start_commands,
    stats_row,
    summary,
    table,
    torpor_stack,
    write_result,
)

from shared.envd.client import ConnectEnvdClient

COMMANDS = ["exec sleep 300001", "exec sleep 300002"]


async def _seed(stack: Stack, envd: ConnectEnvdClient, store: Any) -> tuple[str, str]:
    async with stack.aclient(USER) as http:
        sbx = await create_sandbox(http, autoResume=True)
    sid = sbx["sandboxID"]
    rec = await store.get(sid)
    await start_commands(envd, rec, COMMANDS)
    return sid, rec.envd_access_token


async def _request(proxy: httpx.AsyncClient, sid: str, token: str) -> tuple[float, int | str]:
    headers = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983", "X-Access-Token": token}
    t0 = time.perf_counter()
    try:
        r = await proxy.get("/health", headers=headers)
        elapsed = time.perf_counter() - t0
        if r.status_code >= 400:
            return elapsed, f"{r.status_code} {r.text[:160]}"
        return elapsed, r.status_code
    except httpx.HTTPError as e:
        return time.perf_counter() - t0, type(e).__name__


async def _resumed_events(stack: Stack, sid: str) -> int:
    import nats

    nc = await nats.connect(stack.nats_url)
    try:
        js = nc.jetstream()
        sub = await js.subscribe(f"sandbox.evt.resumed.{sid}", ordered_consumer=True)
        count = 0
        while True:
            try:
                await sub.next_msg(timeout=0.5)
                count += 1
            except TimeoutError:
                return count
    finally:
        await nc.close()


async def run(rounds: int, burst: int) -> dict[str, Any]:
    envd = ConnectEnvdClient()
    singles: list[float] = []
    burst_slowest: list[float] = []
    burst_all: list[float] = []
    errors: dict[str, int] = {}
    extra_resumes = 0
    loads: list[float] = []
    async with torpor_stack() as stack, stack.store() as store:
        limits = httpx.Limits(max_connections=burst + 4)
        async with (
            stack.aclient(USER) as http,
            httpx.AsyncClient(base_url=stack.proxy_url, timeout=120, limits=limits) as proxy,
        ):
            try:
                sid, token = await _seed(stack, envd, store)
                await pause(http, sid)  # warm-up round, not timed
                await _request(proxy, sid, token)
                for n in range(rounds):
                    await pause(http, sid)
                    elapsed, status = await _request(proxy, sid, token)
                    singles.append(elapsed)
                    if status not in (200, 204):
                        errors[f"single:{status}"] = errors.get(f"single:{status}", 0) + 1
                    await pause(http, sid)
                    before = await store.get(sid)
                    results = await asyncio.gather(
                        *(_request(proxy, sid, token) for _ in range(burst))
                    )
                    after = await store.get(sid)
                    # paused g → resuming (same g) → running g+1: one resume moves it by one.
                    extra_resumes += max(0, after.generation - before.generation - 1)
                    burst_all.extend(t for t, _ in results)
                    burst_slowest.append(max(t for t, _ in results))
                    for _, status in results:
                        if status not in (200, 204):
                            errors[f"burst:{status}"] = errors.get(f"burst:{status}", 0) + 1
                    loads.append(loadavg()[0])
                    print(
                        f"  round {n + 1}/{rounds}: single {elapsed * 1000:.0f} ms, burst "
                        f"slowest {burst_slowest[-1] * 1000:.0f} ms",
                        flush=True,
                    )
                events = await _resumed_events(stack, sid)
            finally:
                await envd.close()
    expected_events = 2 * rounds + 1
    return {
        "rounds": rounds,
        "burst": burst,
        "first_request": summary(singles),
        "burst_slowest_request": summary(burst_slowest),
        "burst_every_request": summary(burst_all),
        "errors": errors,
        "resumed_events": events,
        "expected_resumed_events": expected_events,
        "extra_resumes": extra_resumes + max(0, events - expected_events),
        "load_1m_during": {"min": min(loads), "max": max(loads)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--burst", type=int, default=32)
    args = parser.parse_args()
    result = asyncio.run(run(args.rounds, args.burst))
    path = write_result("auto_resume", result)
    print(f"\nauto-resume through the proxy, {args.rounds} rounds; load {result['load_1m_during']}")
    print(
        table(
            STATS_HEADERS,
            [
                stats_row("first request to a paused sandbox", result["first_request"]),
                stats_row(
                    f"burst of {args.burst}: slowest request", result["burst_slowest_request"]
                ),
                stats_row(f"burst of {args.burst}: every request", result["burst_every_request"]),
            ],
        )
    )
    print(
        f"errors: {result['errors'] or 'none'}; resumed events {result['resumed_events']} "
        f"(expected {result['expected_resumed_events']}); extra resumes {result['extra_resumes']}"
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
