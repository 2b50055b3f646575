"""Warm pools: create from the pool and resume into a warm pod, next to a cold pod start.

    .venv/bin/python bench/pool_bench.py --cycles 20

The whole stack runs with ``TORPOR_POOLS=sandbox-base=1`` (nats + the five services, each its
own process, local runtime). One cycle, interleaved so all see the same machine load:

- create (system): ``POST /sandboxes`` → 201 while a warm pod is ready (the ``created`` event
  must say ``path: warm``); then two background processes are started in it (not timed);
- resume (system): pause (not timed), wait until the pool is full again, ``POST
  /sandboxes/{id}/connect`` → 201 (warm pod claimed, kept layer made its root, processes
  replayed; ``lastResume.path`` must be ``warm`` and both processes must run once);
- claim (runtime alone): a second LocalRuntime with its own pool of one: ``create`` →
  ``wait_ready`` of a new workload while a warm pod is ready (the runtime's share of a create);
- cold pod start (runtime alone, the reference): a bare workload scaled 0 → 1 until ready, and
  until its daemon serves ``List`` (as bench/resume_vs_podstart.py).

Ratios: p50(create) ÷ p50(cold pod start) (target ≤ 0.25), p50(resume) ÷ p50(cold pod start)
(target ≤ 0.5), and the same against the daemon serving. Writes ``bench/results/pools_local.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

from common import (
    STATS_HEADERS,
    USER,
    connect,
    create_sandbox,
    kill,
    loadavg,
    pause,
    ratio,
    stats_row,
    summary,
    table,
    torpor_stack,
    write_result,
)
from resume_vs_podstart import COMMANDS, raw_local

from shared.envd.client import ConnectEnvdClient
from shared.models.snapshots import ProcessConfig
from shared.ports.workloads import Endpoint, WorkloadSpec
from shared.runtime.local import LocalRuntime
from tests.support.pods import warm_pods

TEMPLATE = "sandbox-base"


async def until_warm(probe: Any, within: float = 300.0) -> None:
    deadline = time.monotonic() + within
    while await probe() < 1:
        if time.monotonic() > deadline:
            raise RuntimeError("the pool did not refill")
        await asyncio.sleep(0.05)


async def measure(cycles: int) -> dict[str, Any]:
    creates: list[float] = []
    resumes: list[float] = []
    claims: list[float] = []
    starts: list[float] = []
    servings: list[float] = []
    loads: list[float] = []
    not_warm = bad_replays = 0
    env = {"TORPOR_POOLS": f"{TEMPLATE}=1"}
    envd = ConnectEnvdClient()
    async with torpor_stack(env=env) as stack, raw_local(stack) as raw:
        pool_rt = LocalRuntime(
            nats_url=stack.nats_url,
            data_dir=stack.root / "raw-pool",
            bucket=f"bench_pool_{uuid.uuid4().hex[:6]}",
            pools={TEMPLATE: 1},
            poll_interval=0.2,
        )
        await pool_rt.start()
        try:
            await raw()  # warm-up of the bare workload

            async def runtime_warm() -> int:
                return await pool_rt.warm_pods(TEMPLATE)

            async def system_warm() -> int:
                return await warm_pods(stack.nats_url)

            async with stack.aclient(USER) as http, stack.store() as store:
                for n in range(-1, cycles):  # cycle -1: untimed warm-up of every path
                    await until_warm(system_warm)
                    t0 = time.perf_counter()
                    sid = (await create_sandbox(http))["sandboxID"]
                    created = time.perf_counter() - t0
                    warm = (await stack.last_event("created", sid)).get("path") == "warm"
                    rec = await store.get(sid)
                    ep = Endpoint(host=rec.host, pod_uid=rec.pod_uid)
                    for command in COMMANDS:
                        await envd.start_process(
                            ep,
                            ProcessConfig(cmd="/bin/bash", args=["-l", "-c", command]),
                            tag=None,
                            access_token=rec.envd_access_token,
                        )
                    await pause(http, sid)
                    await until_warm(system_warm)
                    t0 = time.perf_counter()
                    code = await connect(http, sid)
                    resumed = time.perf_counter() - t0
                    native = (await http.get(f"/api/v1/sandbox/{sid}")).json()
                    warm = warm and (native.get("lastResume") or {}).get("path") == "warm"
                    rec = await store.get(sid)
                    live = await envd.list_processes(
                        Endpoint(host=rec.host, pod_uid=rec.pod_uid),
                        access_token=rec.envd_access_token,
                    )
                    replayed = sorted(p.config.args[-1] for p in live if p.config.args)
                    await kill(http, sid)

                    await until_warm(runtime_warm)
                    name = f"claim-{uuid.uuid4().hex[:8]}"
                    t0 = time.perf_counter()
                    await pool_rt.create(
                        WorkloadSpec(name=name, owner="bench", access_token=uuid.uuid4().hex)
                    )
                    claimed_ep = await pool_rt.wait_ready(name, timeout=120)
                    claimed = time.perf_counter() - t0
                    await pool_rt.delete(name)

                    started, served, _stopped = await raw()
                    if n < 0:
                        continue
                    if not warm or not claimed_ep.warm:
                        not_warm += 1
                        continue
                    if code != 201 or replayed != sorted(COMMANDS):
                        bad_replays += 1
                    creates.append(created)
                    resumes.append(resumed)
                    claims.append(claimed)
                    starts.append(started)
                    servings.append(served)
                    loads.append(loadavg()[0])
                    print(
                        f"  {n + 1}/{cycles}: create {created * 1000:.0f} ms, resume "
                        f"{resumed * 1000:.0f} ms, claim {claimed * 1000:.0f} ms, cold pod "
                        f"{started * 1000:.0f} ms, load {loads[-1]}",
                        flush=True,
                    )
        finally:
            await pool_rt.close()
            await envd.close()
    create, resume, claim = summary(creates), summary(resumes), summary(claims)
    start, serving = summary(starts), summary(servings)
    return {
        "cycles": len(creates),
        "skipped_not_warm": not_warm,
        "bad_replays": bad_replays,
        "processes_per_sandbox": len(COMMANDS),
        "create_warm": create,
        "resume_warm": resume,
        "claim_runtime": claim,
        "pod_start": start,
        "pod_serving": serving,
        "ratio_create_to_pod_start_p50": ratio(create["p50_ms"], start["p50_ms"]),
        "ratio_resume_to_pod_start_p50": ratio(resume["p50_ms"], start["p50_ms"]),
        "ratio_claim_to_pod_start_p50": ratio(claim["p50_ms"], start["p50_ms"]),
        "ratio_create_to_pod_serving_p50": ratio(create["p50_ms"], serving["p50_ms"]),
        "ratio_resume_to_pod_serving_p50": ratio(resume["p50_ms"], serving["p50_ms"]),
        "load_1m_during": {
            "min": min(loads),
            "max": max(loads),
            "mean": round(sum(loads) / len(loads), 2),
        },
        "samples_s": {
            "create_warm": [round(x, 4) for x in creates],
            "resume_warm": [round(x, 4) for x in resumes],
            "claim_runtime": [round(x, 4) for x in claims],
            "pod_start": [round(x, 4) for x in starts],
            "pod_serving": [round(x, 4) for x in servings],
        },
    }


def report(result: dict[str, Any]) -> None:
    print(
        f"\nlocal runtime, pool of 1: {result['cycles']} cycles "
        f"({result['skipped_not_warm']} skipped: not warm); load {result['load_1m_during']}"
    )
    rows = [
        stats_row("create from the pool (POST /sandboxes → 201)", result["create_warm"]),
        stats_row("resume into a warm pod (connect → 201, replayed)", result["resume_warm"]),
        stats_row("claim (runtime alone: create → ready)", result["claim_runtime"]),
        stats_row("cold pod start → ready (runtime alone)", result["pod_start"]),
        stats_row("cold pod start → daemon serves List", result["pod_serving"]),
    ]
    print(table(STATS_HEADERS, rows))
    print(
        f"p50 ÷ cold pod start: create {result['ratio_create_to_pod_start_p50']} (target 0.25), "
        f"resume {result['ratio_resume_to_pod_start_p50']} (target 0.5), claim "
        f"{result['ratio_claim_to_pod_start_p50']}; ÷ pod serving: create "
        f"{result['ratio_create_to_pod_serving_p50']}, resume "
        f"{result['ratio_resume_to_pod_serving_p50']}; bad replays {result['bad_replays']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20)
    args = parser.parse_args()
    result = asyncio.run(measure(args.cycles))
    result["command"] = f"bench/pool_bench.py --cycles {args.cycles}"
    report(result)
    print(f"wrote {write_result('pools_local', {'runtime': 'local', **result})}")


if __name__ == "__main__":
    main()
