"""Lifecycle throughput: pause+resume cycles per second across many sandboxes, with 1 and with 3
replicas of every service.

    .venv/bin/python bench/lifecycle_throughput_bench.py [--sandboxes 12] [--cycles 5]
        [--replicas 1 3]

Whole stack on the local runtime (``--replicas`` copies of api, proxy, scheduler, snapshotter and
scaler). Each sandbox runs one background process; every sandbox then does ``--cycles`` rounds of
``pause`` → ``connect`` concurrently (clients spread over the API replicas). Throughput =
completed cycles ÷ wall time; the per-operation latency under this load is reported too. After
the run every sandbox must be running with its process exactly once.

Writes ``bench/results/lifecycle_throughput.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from common import (
    USER,
    Stack,
    connect,
    create_sandbox,
    loadavg,
    pause,
    start_commands,
    summary,
    table,
    torpor_stack,
    write_result,
)

from shared.envd.client import ConnectEnvdClient
from shared.ports.workloads import Endpoint

COMMAND = "exec sleep 400001"


async def _one(stack: Stack, index: int, envd: ConnectEnvdClient, store: Any) -> str:
    async with stack.aclient(USER, index=index) as http:
        sid = str((await create_sandbox(http))["sandboxID"])
    rec = await store.get(sid)
    await start_commands(envd, rec, [COMMAND])
    return sid


async def run(replicas: int, sandboxes: int, cycles: int) -> dict[str, Any]:
    envd = ConnectEnvdClient()
    pauses: list[float] = []
    resumes: list[float] = []
    failures: list[str] = []
    async with torpor_stack(replicas=replicas) as stack, stack.store() as store:
        try:
            ids = []
            for i in range(0, sandboxes, 4):  # create in small groups (2 cores)
                ids += await asyncio.gather(
                    *(_one(stack, j, envd, store) for j in range(i, min(i + 4, sandboxes)))
                )
            load_before = loadavg()

            async def worker(i: int, sid: str) -> None:
                async with stack.aclient(USER, index=i) as http:
                    for _ in range(cycles):
                        try:
                            t0 = time.perf_counter()
                            await pause(http, sid)
                            t1 = time.perf_counter()
                            await connect(http, sid)
                            t2 = time.perf_counter()
                        except Exception as e:
                            failures.append(repr(e)[:200])
                            continue
                        pauses.append(t1 - t0)
                        resumes.append(t2 - t1)

            began = time.perf_counter()
            await asyncio.gather(*(worker(i, sid) for i, sid in enumerate(ids)))
            wall = time.perf_counter() - began
            load_after = loadavg()
            wrong = 0
            for sid in ids:
                rec = await store.get(sid)
                live = await envd.list_processes(
                    Endpoint(host=rec.host, pod_uid=rec.pod_uid),
                    access_token=rec.envd_access_token,
                )
                if [p.config.args[-1] for p in live] != [COMMAND]:
                    wrong += 1
        finally:
            await envd.close()
    done = len(resumes)
    return {
        "replicas": replicas,
        "sandboxes": sandboxes,
        "cycles_per_sandbox": cycles,
        "completed_cycles": done,
        "failures": failures,
        "wall_s": round(wall, 1),
        "cycles_per_s": round(done / wall, 3),
        "pause_under_load": summary(pauses),
        "resume_under_load": summary(resumes),
        "sandboxes_with_wrong_processes": wrong,
        "load_1m": {"before": load_before[0], "after": load_after[0]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=12)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 3])
    args = parser.parse_args()
    runs = []
    for replicas in args.replicas:
        print(f"replicas={replicas} ...", flush=True)
        runs.append(asyncio.run(run(replicas, args.sandboxes, args.cycles)))
    path = write_result("lifecycle_throughput", {"runs": runs})
    print(
        table(
            (
                "replicas/service",
                "sandboxes",
                "cycles",
                "cycles/s",
                "pause p50 ms",
                "resume p50 ms",
                "resume p99 ms",
                "failures",
                "wrong procs",
                "load 1m",
            ),
            [
                (
                    r["replicas"],
                    r["sandboxes"],
                    r["completed_cycles"],
                    r["cycles_per_s"],
                    r["pause_under_load"].get("p50_ms", ""),
                    r["resume_under_load"].get("p50_ms", ""),
                    r["resume_under_load"].get("p99_ms", ""),
                    len(r["failures"]),
                    r["sandboxes_with_wrong_processes"],
                    f"{r['load_1m']['before']}→{r['load_1m']['after']}",
                )
                for r in runs
            ],
        )
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
