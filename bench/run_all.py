"""Every benchmark, one after another, then the ratios against torpor's targets.

    .venv/bin/python bench/run_all.py            # the published run (about an hour on 2 cores)
    .venv/bin/python bench/run_all.py --quick    # a smoke run (small counts, minutes)
    .venv/bin/python bench/run_all.py --only resume_local auto_resume
    .venv/bin/python bench/run_all.py --summary  # only re-read bench/results/*.json

Each benchmark is its own script (run it alone to repeat one figure); this runner calls them in
sequence, never in parallel (they would measure each other), records the load average before each
and writes ``bench/results/summary.json`` with the ratios and targets:

- resume ÷ pod start p50: ≤ 1.2 on the local runtime, ≤ 1.3 on Kubernetes;
- proxy throughput ÷ direct: ≥ 0.8;
- scheduler lateness p99: ≤ 1 s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import REPO, RESULTS, loadavg, machine, table

PY = sys.executable

# name → (full argv, quick argv)
BENCHES: dict[str, tuple[list[str], list[str]]] = {
    "resume_local": (
        ["bench/resume_vs_podstart.py", "--runtime", "local", "--cycles", "100"],
        ["bench/resume_vs_podstart.py", "--runtime", "local", "--cycles", "10"],
    ),
    "resume_kubernetes": (
        ["bench/resume_vs_podstart.py", "--runtime", "kubernetes", "--cycles", "100"],
        ["bench/resume_vs_podstart.py", "--runtime", "kubernetes", "--cycles", "10"],
    ),
    "auto_resume": (
        ["bench/auto_resume_bench.py", "--rounds", "20", "--burst", "32"],
        ["bench/auto_resume_bench.py", "--rounds", "3", "--burst", "16"],
    ),
    "freeze": (
        ["bench/freeze_bench.py", "--rounds", "30"],
        ["bench/freeze_bench.py", "--rounds", "5", "--sizes", "1,100"],
    ),
    "proxy": (
        ["bench/proxy_bench.py", "--requests", "2000", "--concurrency", "32", "--no-resume"],
        ["bench/proxy_bench.py", "--requests", "300", "--concurrency", "16", "--no-resume"],
    ),
    "lifecycle_throughput": (
        ["bench/lifecycle_throughput_bench.py", "--sandboxes", "12", "--cycles", "5"],
        ["bench/lifecycle_throughput_bench.py", "--sandboxes", "4", "--cycles", "2"],
    ),
    "scheduler": (
        # Issue 20: 100,000 deadlines over 10 minutes. Loading and arming take 45-130 s on 2
        # cores (load 1-6); the spread starts 330 s after the load began.
        [
            "bench/scheduler_bench.py",
            "--sandboxes",
            "100000",
            "--spread-min",
            "0",
            "--spread-max",
            "600",
            "--margin",
            "330",
        ],
        [
            "bench/scheduler_bench.py",
            "--sandboxes",
            "2000",
            "--spread-min",
            "20",
            "--spread-max",
            "40",
        ],
    ),
}


def run(name: str, argv: list[str]) -> dict[str, Any]:
    print(f"\n=== {name}: {' '.join(argv)}  (load {loadavg()})", flush=True)
    began = time.monotonic()
    code = subprocess.call([PY, *argv], cwd=REPO)
    return {"argv": argv, "exit": code, "seconds": round(time.monotonic() - began)}


def _read(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def targets() -> list[dict[str, Any]]:
    """The ratios the issue asks for, from whatever result files exist."""
    rows: list[dict[str, Any]] = []
    for rt, target in (("local", 1.2), ("kubernetes", 1.3)):
        if doc := _read(f"resume_{rt}"):
            load = doc["load_1m_during"]
            for against, key in (("ready", "pod_start"), ("serving", "pod_serving")):
                value = doc.get(f"ratio_resume_to_{key}_p50")
                if value is None:
                    continue
                rows.append(
                    {
                        "figure": f"resume ÷ pod {against} p50 ({rt})",
                        "value": value,
                        "target": f"≤ {target}",
                        "met": value <= target,
                        "detail": f"resume p50 {doc['resume']['p50_ms']} ms / pod {against} p50 "
                        f"{doc[key]['p50_ms']} ms; load {load}",
                    }
                )
    if doc := _read("proxy_bench"):
        worst = min(doc["overhead"], key=lambda r: r["throughput_ratio"])
        rows.append(
            {
                "figure": "proxy throughput ÷ direct (worst case)",
                "value": round(worst["throughput_ratio"], 3),
                "target": "≥ 0.9",  # issue 20
                "met": worst["throughput_ratio"] >= 0.9,
                "detail": "; ".join(
                    f"{r['case']} c={r['concurrency']}: {r['throughput_ratio']:.2f}"
                    for r in doc["overhead"]
                ),
            }
        )
    if doc := _read("scheduler"):
        rows.append(
            {
                "figure": f"scheduler lateness p99 ({doc['sandboxes']} deadlines)",
                "value": doc["lateness_p99_s"],
                "target": "≤ 1 s",
                "met": doc["lateness_p99_s"] <= 1.0,
                "detail": f"p50 {doc['lateness_p50_s']} s, max {doc['lateness_max_s']} s, "
                f"RSS {doc.get('rss_peak_mib')} MiB, missing {doc.get('missing')}",
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHES))
    parser.add_argument("--summary", action="store_true", help="run nothing, summarise results")
    args = parser.parse_args()
    runs: dict[str, Any] = {}
    if not args.summary:
        for name in args.only or BENCHES:
            full, quick = BENCHES[name]
            runs[name] = run(name, quick if args.quick else full)
    rows = targets()
    print(
        "\n"
        + table(
            ("figure", "value", "target", "met"),
            [(r["figure"], r["value"], r["target"], "yes" if r["met"] else "NO") for r in rows],
        )
    )
    out = RESULTS / "summary.json"
    out.write_text(
        json.dumps({"runs": runs, "targets": rows, "machine": machine()}, indent=2) + "\n"
    )
    print(f"wrote {out}")
    failed = [n for n, r in runs.items() if r["exit"] != 0]
    if failed:
        print(f"benchmarks that failed: {failed}")
        raise SystemExit(1)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
