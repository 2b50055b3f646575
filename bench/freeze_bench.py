"""What stopping a sandbox for its kept-files export costs (``services/envd/freezing.py``): the
daemon's ``Freezer.freeze()`` (passes over ``/proc`` until one stops nothing new, then the wait
until each shows ``T``) and ``thaw()``, against how many processes the sandbox runs.

The freezer runs in this process, in the host's PID namespace, where it stops only its own
descendants: per size, ``--sizes`` idle processes (``sleep``) and, with ``--busy``, that many
shell loops that fork a ``sleep 0.01`` all the time (the case that needs several passes). Each
round: freeze (timed), thaw (timed); the passes are counted. Nothing else on the host is
stopped (only this process's descendants are candidates).

    .venv/bin/python bench/freeze_bench.py [--rounds 30] [--sizes 1,10,100,500] [--busy 4]

Writes ``bench/results/freeze.json``.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from typing import Any

from common import STATS_HEADERS, loadavg, stats_row, summary, table, write_result

from services.envd.freezing import Freezer

BUSY_LOOP = "while :; do sleep 0.01; done"


class CountingFreezer(Freezer):
    passes = 0

    def _pass(self, *, whole_namespace: bool) -> bool:
        self.passes += 1
        return super()._pass(whole_namespace=whole_namespace)


def measure(idle: int, busy: int, rounds: int) -> dict[str, Any]:
    procs = [subprocess.Popen(["sleep", "3600"]) for _ in range(idle)]
    procs += [subprocess.Popen(["sh", "-c", BUSY_LOOP]) for _ in range(busy)]
    time.sleep(0.5)  # every process started (and the loops forking)
    freezes, thaws, passes, stopped = [], [], [], []
    load_before = loadavg()
    try:
        for _ in range(rounds):
            freezer = CountingFreezer()
            t0 = time.perf_counter()
            stopped.append(freezer.freeze())
            t1 = time.perf_counter()
            freezer.thaw()
            t2 = time.perf_counter()
            freezes.append(t1 - t0)
            thaws.append(t2 - t1)
            passes.append(freezer.passes)
            time.sleep(0.05)  # let the loops run between rounds
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
    return {
        "idle": idle,
        "busy": busy,
        "freeze": summary(freezes),
        "thaw": summary(thaws),
        "passes_max": max(passes),
        "stopped_min": min(stopped),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--sizes", default="1,10,100,500")
    parser.add_argument("--busy", type=int, default=4, help="forking loops added to each size")
    args = parser.parse_args()
    runs = []
    for size in (int(s) for s in args.sizes.split(",")):
        runs.append(measure(size, 0, args.rounds))
        if args.busy:
            runs.append(measure(size, args.busy, args.rounds))
    rows = []
    for run in runs:
        label = f"{run['idle']} idle + {run['busy']} forking"
        rows.append(stats_row(f"freeze, {label}", run["freeze"]))
        rows.append(stats_row(f"thaw, {label}", run["thaw"]))
    print(table(STATS_HEADERS, rows))
    print("passes (max):", [(r["idle"], r["busy"], r["passes_max"]) for r in runs])
    print("loadavg:", loadavg())
    path = write_result("freeze", {"rounds": args.rounds, "runs": runs})
    print(f"written: {path}")


if __name__ == "__main__":
    main()
