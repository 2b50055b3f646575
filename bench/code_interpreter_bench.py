"""code-interpreter-v1 side by side with its physical limits (issue 33, "Performance"), as E2B's
``python/tests/performance.py`` measures it, on private stacks (local runtime):

- ``create+first``: ``Sandbox.create()`` + the first ``run_code("print(1)")``, cold (a pod
  started for it) and warm (``TORPOR_POOLS=code-interpreter-v1=N``: a pod with its kernel up);
- ``second``: a later ``run_code("print(1)")`` through the proxy and the execution server;
- ``direct``: the same execute round trip over the kernel's ZMQ channels from inside the sandbox
  (jupyter_client, no server, no proxy): the floor of ``second``;
- ``kernel_start``: a cold python kernel start inside the sandbox (start to ready);
- ``idle_rss``: resident memory of an idle sandbox's processes (server, kernels, daemon).

    .venv/bin/python bench/code_interpreter_bench.py [--rounds 5] [--runs 30] [--json FILE]
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
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TEMPLATE = "code-interpreter-v1"
DIRECT = r"""
import asyncio, json, sys, time
from jupyter_client.manager import AsyncKernelManager
async def main(runs):
    t0 = time.perf_counter()
    km = AsyncKernelManager(kernel_name="python3")
    await km.start_kernel()
    kc = km.client(); kc.start_channels(); await kc.wait_for_ready(timeout=60)
    start = time.perf_counter() - t0
    times = []
    for _ in range(runs + 3):
        t = time.perf_counter()
        msg_id = kc.execute("print(1)")
        while True:
            m = await kc.get_iopub_msg(timeout=30)
            if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "status" \
                    and m["content"]["execution_state"] == "idle":
                break
        times.append(time.perf_counter() - t)
    await km.shutdown_kernel(now=True)
    print(json.dumps({"kernel_start": start, "direct": times[3:]}))
asyncio.run(main(int(sys.argv[1])))
"""


def p50(values: list[float]) -> float:
    return statistics.median(values)


def measure(
    opts: dict[str, Any], rounds: int, runs: int, *, inside: bool, between: float = 0.0
) -> dict[str, Any]:
    from e2b_code_interpreter import Sandbox

    first: list[float] = []
    second: list[float] = []
    result: dict[str, Any] = {}
    for i in range(rounds):
        time.sleep(between)  # a warm pool refills one pod at a time
        t = time.perf_counter()
        s = Sandbox.create(timeout=300, **opts)
        s.run_code("print(1)")
        first.append(time.perf_counter() - t)
        try:
            for _ in range(runs if i == 0 else 3):
                t = time.perf_counter()
                s.run_code("print(1)")
                second.append(time.perf_counter() - t)
            if inside and i == 0:
                s.files.write("/tmp/direct.py", DIRECT)
                out = s.commands.run(
                    f"/opt/torpor/venv/bin/python /tmp/direct.py {runs}", timeout=300
                )
                direct = json.loads(out.stdout.strip().splitlines()[-1])
                result["direct_p50_ms"] = p50(direct["direct"]) * 1000
                result["kernel_start_s"] = direct["kernel_start"]
                rss = s.commands.run("ps -eo rss= | awk '{s+=$1} END {print s}'", user="root")
                result["idle_rss_mib"] = int(rss.stdout.strip()) / 1024
        finally:
            s.kill()
    result["create_first_p50_s"] = p50(first)
    result["second_p50_ms"] = p50(second) * 1000
    result["rounds"] = rounds
    return result


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.common import sdk_opts, torpor_stack

    out: dict[str, Any] = {}
    async with torpor_stack() as stack:
        opts = sdk_opts(stack)
        out["cold"] = await asyncio.to_thread(measure, opts, args.rounds, args.runs, inside=True)
    async with torpor_stack(env={"TORPOR_POOLS": f"{TEMPLATE}={args.pool}"}) as stack:
        opts = sdk_opts(stack)
        await asyncio.sleep(args.pool_fill)  # let the pool fill
        out["warm"] = await asyncio.to_thread(
            measure, opts, args.rounds, args.runs, inside=False, between=args.pool_fill / 2
        )
    cold, warm = out["cold"], out["warm"]
    out["second_over_direct"] = cold["second_p50_ms"] / cold["direct_p50_ms"]
    out["warm_create_first_over_cold"] = warm["create_first_p50_s"] / cold["create_first_p50_s"]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="sandboxes created per phase")
    p.add_argument("--runs", type=int, default=30, help="second run_code calls measured")
    p.add_argument("--pool", type=int, default=2, help="warm pool size")
    p.add_argument("--pool-fill", type=float, default=30.0, help="seconds to let the pool fill")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    out = asyncio.run(run(args))
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
