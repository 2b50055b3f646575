"""Where the time of a claim goes: p50 of every stage of a create from the pool and a resume
into a warm pod, from the timing lines of a kept benchmark stack's logs.

    TORPOR_BENCH_LOG_LEVEL=info TORPOR_BENCH_LOG_FORMAT=json TORPOR_BENCH_KEEP=1 \\
        .venv/bin/python bench/pool_bench.py --runtime kubernetes --cycles 12
    .venv/bin/python bench/claim_breakdown.py /tmp/torpor-bench-pools-k8s-XXXX/stack/logs

Lines read (JSON, one per operation): the api's ``create_route_timing``/``resume_route_timing``
(the route), ``create_api_timing``/``resume_api_timing`` (the lifecycle service)
and ``http_request``, the scaler's ``create_timing``/``resume_timing``, the Kubernetes
runtime's ``k8s_workload_created``/``k8s_workload_scaled``/``k8s_pool_claimed``/``k8s_ready``/
``k8s_kept_files_restored``, the local runtime's ``runtime_local_pool_bound``. Each ``*_ms``
field is one stage (``total_ms`` the operation). The runtime's lines are split by the command
they ran under (create or resume: the ``subject`` the scaler bound). Only ``path: warm``
operations of the scaler are counted; the warm-up cycle is included (n says how many).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

EVENTS = {
    "http_request",
    "create_route_timing",
    "resume_route_timing",
    "create_api_timing",
    "resume_api_timing",
    "create_timing",
    "resume_timing",
    "k8s_workload_created",
    "k8s_workload_scaled",
    "k8s_pool_bound",
    "k8s_pool_claimed",
    "k8s_ready",
    "k8s_kept_files_restored",
    "runtime_local_pool_bound",
}


def op_of(line: dict[str, Any]) -> str:
    """create or resume: the scaler's command (its subject), or the api's route."""
    subject = str(line.get("subject") or "")
    parts = subject.split(".")
    if len(parts) >= 3 and parts[0] == "sandbox":
        return parts[2]
    event = str(line.get("event") or "")
    if event.startswith(("create_", "resume_")):
        return event.split("_", maxsplit=1)[0]
    route = str(line.get("route") or "")
    if route.endswith(("/connect", "/resume")):
        return "resume"
    if line.get("method") == "POST" and route == "/sandboxes":
        return "create"
    return "?"


def key_of(line: dict[str, Any]) -> str | None:
    event = line.get("event")
    if event not in EVENTS:
        return None
    if event == "http_request":
        op = op_of(line)
        return f"api http_request ({op})" if op in ("create", "resume") else None
    if event in ("create_timing", "resume_timing") and line.get("path", "warm") != "warm":
        return None
    if event == "k8s_workload_scaled" and line.get("replicas") != 1:
        return None
    if event == "k8s_ready" and not line.get("warm"):
        return None
    service = line.get("service", "?")
    return f"{service} {event} ({op_of(line)})"


def collect(folder: Path) -> dict[str, dict[str, list[float]]]:
    stages: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(folder.glob("*.log")):
        for raw in path.read_text(errors="replace").splitlines():
            if not raw.startswith("{"):
                continue
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            key = key_of(line)
            if key is None:
                continue
            for field, value in line.items():
                if isinstance(value, int | float) and (field.endswith("_ms") or field == "ms"):
                    stages[key][field].append(float(value))
    return stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", type=Path, help="the kept stack's logs folder")
    parser.add_argument("--json", action="store_true", help="print the breakdown as JSON")
    args = parser.parse_args()
    stages = collect(args.logs)
    if not stages:
        sys.exit(f"no timing lines in {args.logs} (TORPOR_BENCH_LOG_FORMAT=json, LOG_LEVEL=info?)")
    out = {
        key: {field: [len(v), round(statistics.median(v), 1)] for field, v in fields.items()}
        for key, fields in sorted(stages.items())
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for key, fields in out.items():
        print(key)
        for field, (n, p50) in fields.items():
            print(f"    {field:<24} p50 {p50:>8.1f} ms  (n={n})")


if __name__ == "__main__":
    main()
