"""Snapshot and fork time through the unmodified e2b SDK, by the sandbox's data size.

    .venv/bin/python bench/snapshot_fork_bench.py --sizes 0,64,256 --rounds 3

What runs: a private torpor stack (``bench.common.torpor_stack``: nats-server and the five services
as processes, local runtime, bubblewrap pods). For each size (MiB written into the source's
``/workspace`` as one file, plus a background process), each round times, one at a time:

- ``create_snapshot``: the SDK call until it returns (List over envd, files copied into the
  snapshot store, record ready);
- ``create from snapshot``: ``Sandbox.create(<snapshot id>)`` until it returns (new pod ready,
  files restored, process replayed), then (not timed) the file's size and the replayed process
  are checked;
- ``fork(1)`` and ``fork(3)``: ``sbx.fork(count)`` until it returns all forks running (one
  snapshot, then the forks concurrently, then the snapshot deleted).

Prints a table and writes ``bench/results/snapshot_fork_local.json``.
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
    sdk_opts,
    stats_row,
    summary,
    table,
    torpor_stack,
    write_result,
)

MARKER = "sleep 86398"


def _timed(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def run_size(opts: dict[str, Any], mib: int, rounds: int) -> dict[str, list[float]]:
    from e2b import Sandbox

    times: dict[str, list[float]] = {"snapshot": [], "create_from": [], "fork1": [], "fork3": []}
    src = Sandbox.create(template="base", timeout=1800, **opts)
    try:
        if mib:
            src.commands.run(
                f"head -c {mib * 1024 * 1024} /dev/urandom > /home/user/blob", timeout=300
            )
        src.commands.run(MARKER, background=True, timeout=0)
        for _ in range(rounds):
            took, info = _timed(src.create_snapshot)
            times["snapshot"].append(took)
            took, new = _timed(lambda info=info: Sandbox.create(info.snapshot_id, **opts))
            times["create_from"].append(took)
            if mib:
                size = new.commands.run("stat -c %s /home/user/blob").stdout.strip()
                assert int(size) == mib * 1024 * 1024, size
            assert any(MARKER in " ".join([p.cmd, *p.args]) for p in new.commands.list())
            new.kill()
            Sandbox.delete_snapshot(info.snapshot_id, **opts)
            for count in (1, 3):
                took, forks = _timed(lambda count=count: src.fork(count=count, timeout=300))
                ok = [f for f in forks if isinstance(f, Sandbox)]
                assert len(ok) == count, forks
                times[f"fork{count}"].append(took)
                for f in ok:
                    f.kill()
    finally:
        src.kill()
    return times


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="0,64,256", help="MiB of data in /workspace, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]

    results: dict[str, Any] = {}
    async with torpor_stack() as stack:
        opts = sdk_opts(stack)
        for mib in sizes:
            times = await asyncio.to_thread(run_size, opts, mib, args.rounds)
            results[f"{mib}MiB"] = {k: summary(v) for k, v in times.items()}
    rows = []
    for size, ops in results.items():
        for op, stats in ops.items():
            rows.append(stats_row(f"{size} {op}", stats))
    print(table(STATS_HEADERS, rows))
    path = write_result(
        "snapshot_fork_local", {"sizes_mib": sizes, "rounds": args.rounds, "results": results}
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    asyncio.run(main())
