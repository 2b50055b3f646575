"""Local runtime: pod start→ready latency over scale 0→1 cycles (the resume path's pod part).

Each cycle: ``scale(1)`` then ``wait_ready`` (timed: bubblewrap start, the real in-sandbox daemon
``python -m services.envd`` importing and answering ``/health``), then ``scale(0)`` and
``wait_stopped`` (timed separately). Each cycle also starts the same daemon *without* bubblewrap
or the runtime (plain subprocess, polled ``/health``) as a baseline under the same machine load,
so the runtime's own overhead is the difference. Embedded nats-server, loopback only.

    .venv/bin/python bench/pod_start_bench.py [--cycles 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from shared.bus.server import EmbeddedNats
from shared.logging import configure
from shared.ports.workloads import WorkloadSpec
from shared.runtime.local import LocalRuntime
from shared.settings import LoggingSettings

RESULTS = Path(__file__).with_name("results") / "pod_start_local.json"
BASELINE_ADDRESS = "127.0.20.250"


async def baseline_start(root: Path) -> float:
    """Start→/health of the bare daemon (no bwrap, no runtime), then stop it."""
    import httpx

    began = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.envd",
        "--listen",
        f"{BASELINE_ADDRESS}:49983",
        "--root",
        str(root),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            while True:
                try:
                    r = await client.get(f"http://{BASELINE_ADDRESS}:49983/health", timeout=5)
                    if r.is_success:
                        return time.perf_counter() - began
                except httpx.HTTPError:
                    await asyncio.sleep(0.02)
    finally:
        process.terminate()
        await process.wait()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(values, 50) * 1000, 1),
        "p90_ms": round(percentile(values, 90) * 1000, 1),
        "p99_ms": round(percentile(values, 99) * 1000, 1),
        "min_ms": round(min(values) * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
        "mean_ms": round(statistics.fmean(values) * 1000, 1),
    }


async def run(cycles: int, work: Path) -> dict[str, object]:
    server = EmbeddedNats(data_dir=work / "nats").start()
    runtime = LocalRuntime(
        nats_url=server.url,
        data_dir=work / "runtime",
        bucket=f"bench_{uuid.uuid4().hex[:8]}",
    )
    try:
        await runtime.start()
        name = f"bench-{uuid.uuid4().hex[:8]}"
        await runtime.create(WorkloadSpec(name=name, owner="bench", replicas=0))
        starts: list[float] = []
        stops: list[float] = []
        baseline: list[float] = []
        (work / "baseline").mkdir()
        uids = set()
        for _ in range(cycles):
            began = time.perf_counter()
            await runtime.scale(name, 1)
            endpoint = await runtime.wait_ready(name, timeout=60)
            starts.append(time.perf_counter() - began)
            uids.add(endpoint.pod_uid)
            began = time.perf_counter()
            await runtime.scale(name, 0)
            await runtime.wait_stopped(name, timeout=60)
            stops.append(time.perf_counter() - began)
            baseline.append(await baseline_start(work / "baseline"))
        await runtime.delete(name)
        assert len(uids) == cycles, "every start must be a new pod"
    finally:
        await runtime.close()
        server.stop()
    return {
        "benchmark": "pod_start_local",
        "cycles": cycles,
        "start_to_ready": summary(starts),
        "stop": summary(stops),
        "bare_daemon_start_to_health": summary(baseline),
        "host": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "kernel": platform.release(),
        },
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main() -> None:
    configure(LoggingSettings(log_level="warning"), service="bench")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="torpor-bench-") as tmp:
        result = asyncio.run(run(args.cycles, Path(tmp)))
    print(f"local runtime, {args.cycles} scale 0→1 cycles (ms)")
    print(f"{'':<16}{'p50':>8}{'p90':>8}{'p99':>8}{'min':>8}{'max':>8}{'mean':>8}")
    rows = (
        ("start→ready", "start_to_ready"),
        ("stop", "stop"),
        ("bare daemon", "bare_daemon_start_to_health"),
    )
    for label, key in rows:
        row = result[key]
        assert isinstance(row, dict)
        cells = "".join(
            f"{row[k]:>8.1f}" for k in ("p50_ms", "p90_ms", "p99_ms", "min_ms", "max_ms", "mean_ms")
        )
        print(f"{label:<16}{cells}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
