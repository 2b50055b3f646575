"""A code-interpreter-v1 sandbox paused with its memory against a files-only pause, side by side
with a new sandbox (the cold start a resume competes with), through the unmodified
``e2b-code-interpreter`` SDK on a private stack (local runtime, CRIU):

- ``memory``: ``pause(mode="full")``, ``Sandbox.connect``, then the first ``run_code`` reads a
  variable set before the pause (checked: the kernel kept it);
- ``files``: plain ``pause()`` (files only), ``connect``, then the first ``run_code`` (the server
  is replayed and starts a new kernel: the variable is gone, checked);
- ``cold``: ``Sandbox.create()`` and its first ``run_code`` (the physical limit here: the runtime
  starting a pod with its server and kernel).

The three are interleaved, one round each per cycle, so they see the same machine load. Each
timing is ``pause``, ``resume`` (connect until it answers) and ``first`` (that run_code); ``back``
is resume + first: how long until the user's code runs again.

    .venv/bin/python bench/memory_pause_bench.py [--cycles 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import (  # noqa: E402
    STATS_HEADERS,
    loadavg,
    ratio,
    save_result,
    sdk_opts,
    stats_row,
    summary,
    table,
    torpor_stack,
)


def _timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    t = time.perf_counter()
    value = fn(*args, **kwargs)
    return value, time.perf_counter() - t


def cycle(opts: dict[str, Any], timings: dict[str, dict[str, list[float]]]) -> None:
    from e2b_code_interpreter import Sandbox

    s, created = _timed(Sandbox.create, timeout=600, **opts)
    try:
        first, took = _timed(s.run_code, "x = 41\nprint(1)")
        assert first.error is None, first.error
        timings["cold"]["back"].append(created + took)
        for mode in ("memory", "files"):
            s.run_code("x = 41")
            _, paused = _timed(s.pause, **({"mode": "full"} if mode == "memory" else {}))
            again, resumed = _timed(Sandbox.connect, s.sandbox_id, **opts)
            out, took = _timed(again.run_code, "'x' in globals()")
            want = "True" if mode == "memory" else "False"
            assert out.text == want, (mode, out.text, out.error)
            timings[mode]["pause"].append(paused)
            timings[mode]["resume"].append(resumed)
            timings[mode]["first"].append(took)
            timings[mode]["back"].append(resumed + took)
    finally:
        Sandbox.kill(s.sandbox_id, **opts)


async def run(cycles: int) -> dict[str, Any]:
    timings: dict[str, dict[str, list[float]]] = {
        "memory": {"pause": [], "resume": [], "first": [], "back": []},
        "files": {"pause": [], "resume": [], "first": [], "back": []},
        "cold": {"back": []},
    }
    async with torpor_stack() as stack:
        opts = sdk_opts(stack)
        await asyncio.to_thread(cycle, opts, timings)  # warm-up, not counted
        timings = {k: {m: [] for m in v} for k, v in timings.items()}
        load = [loadavg()]
        for _ in range(cycles):
            await asyncio.to_thread(cycle, opts, timings)
        load.append(loadavg())
    stats = {k: {m: summary(v) for m, v in d.items()} for k, d in timings.items()}
    cold = stats["cold"]["back"]["p50_ms"]
    return {
        "cycles": cycles,
        "loadavg": load,
        "stats": stats,
        "memory_back_over_cold": ratio(stats["memory"]["back"]["p50_ms"], cold),
        "files_back_over_cold": ratio(stats["files"]["back"]["p50_ms"], cold),
        "memory_back_over_files": ratio(
            stats["memory"]["back"]["p50_ms"], stats["files"]["back"]["p50_ms"]
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    result = asyncio.run(run(args.cycles))
    rows = [
        stats_row(f"{kind} {step}", s)
        for kind, steps in result["stats"].items()
        for step, s in steps.items()
    ]
    print(table(STATS_HEADERS, rows))
    for key in ("memory_back_over_cold", "files_back_over_cold", "memory_back_over_files"):
        print(f"{key}: {result[key]:.2f}")
    print(f"loadavg before/after: {result['loadavg']}")
    path = save_result("memory_pause_local", result)
    if args.json is not None:
        args.json.write_text(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
