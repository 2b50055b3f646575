"""Kubernetes runtime latency on the local control plane (etcd, kube-apiserver, KCM, test kubelet).

Measures: control-plane start to ready, then N pause/resume cycles of one sandbox through
``KubernetesRuntime`` — scale 1 → wait_ready (new pod Ready, its daemon answering /health) and
scale 0 → wait_stopped. Also reports the build (binary sizes, build duration from the log).
Everything runs on loopback. Writes ``bench/results/k8s_pod_start.json``.

    .venv/bin/python bench/k8s_pod_start_bench.py [--cycles 30]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from shared.ports.workloads import WorkloadSpec  # noqa: E402
from shared.runtime.kubernetes import KubernetesRuntime  # noqa: E402
from tests.support.k8s.kubelet import TestKubelet, real_envd_available  # noqa: E402
from tests.support.k8s.plugin import admin_client, create_namespace, sandbox_templates  # noqa: E402
from tests.support.k8s.rig import ControlPlane, ensure_binaries  # noqa: E402

RESULTS = REPO / "bench" / "results" / "k8s_pod_start.json"
BUILD_LOG = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "torpor" / "build-k8s.log"
)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(pct(values, 0.50) * 1000, 1),
        "p99_ms": round(pct(values, 0.99) * 1000, 1),
        "min_ms": round(min(values) * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
        "mean_ms": round(statistics.fmean(values) * 1000, 1),
    }


def build_info(bin_dir: Path) -> dict[str, object]:
    sizes = {p.name: p.stat().st_size for p in sorted(bin_dir.iterdir()) if p.is_file()}
    info: dict[str, object] = {
        "bin_dir": str(bin_dir),
        "binary_mb": {k: round(v / 2**20, 1) for k, v in sizes.items()},
        "total_mb": round(sum(sizes.values()) / 2**20, 1),
    }
    if BUILD_LOG.exists():
        # The log is created when the build starts and last written when it ends.
        birth = subprocess.run(
            ["stat", "-c", "%W", str(BUILD_LOG)], capture_output=True, text=True, check=False
        ).stdout.strip()
        mtime = BUILD_LOG.stat().st_mtime
        info["build_started"] = dt.datetime.fromtimestamp(int(birth or 0), dt.UTC).isoformat()
        info["build_finished"] = dt.datetime.fromtimestamp(mtime, dt.UTC).isoformat()
        if birth.isdigit() and int(birth) > 0:
            info["build_seconds_from_log"] = round(mtime - int(birth), 1)
    return info


async def cycles(kubeconfig: Path, n: int) -> dict[str, Any]:
    admin = await admin_client(kubeconfig)
    await create_namespace(admin, "bench")
    runtime = await KubernetesRuntime.from_kubeconfig(
        kubeconfig, namespace="bench", templates=sandbox_templates()
    )
    try:
        began = time.perf_counter()
        await runtime.create(WorkloadSpec(name="sbx-bench", owner="bench"))
        await runtime.wait_ready("sbx-bench", timeout=120)
        first = time.perf_counter() - began
        ready, stopped = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            await runtime.scale("sbx-bench", 0)
            await runtime.wait_stopped("sbx-bench", timeout=120)
            stopped.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await runtime.scale("sbx-bench", 1)
            await runtime.wait_ready("sbx-bench", timeout=120)
            ready.append(time.perf_counter() - t0)
        await runtime.delete("sbx-bench")
    finally:
        await runtime.close()
        await admin.close()  # type: ignore[no-untyped-call]
    return {"create_to_ready_ms": round(first * 1000, 1), "scale_up_to_ready": summary(ready),
            "scale_down_to_gone": summary(stopped), "cycles": n}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=30)
    args = parser.parse_args()
    bin_dir = ensure_binaries(build=True)
    work = Path(tempfile.mkdtemp(prefix="torpor-k8s-bench-"))
    plane = ControlPlane(bin_dir=bin_dir, workdir=work / "plane").start()
    kubelet = TestKubelet(kubeconfig=plane.kubeconfig, workdir=work / "kubelet").start()
    try:
        timing = asyncio.run(cycles(plane.kubeconfig, args.cycles))
        # Of the scale-up latency, how much is the daemon itself starting under bubblewrap.
        timing["daemon_start_to_healthy"] = summary(kubelet.daemon_start_seconds)
    finally:
        kubelet.stop()
        plane.stop()
    result = {
        "control_plane_start_s": round(plane.started_in, 2),
        **timing,
        "daemon": "services.envd" if real_envd_available() else "stand-in",
        "isolation": "bubblewrap",
        "build": build_info(bin_dir),
        "cpus": os.cpu_count(),
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    up, down = timing["scale_up_to_ready"], timing["scale_down_to_gone"]

    def row(name: str, stats: dict[str, float]) -> tuple[str, str, str, str]:
        return name, f"{stats['p50_ms']:.0f}", f"{stats['p99_ms']:.0f}", f"{stats['max_ms']:.0f}"

    rows = [
        ("control plane start → /readyz + KCM", f"{plane.started_in * 1000:.0f}", "", ""),
        ("create → first pod Ready", f"{result['create_to_ready_ms']:.0f}", "", ""),
        row(f"scale 1 → new pod Ready (n={args.cycles})", up),
        row(f"scale 0 → pod gone (n={args.cycles})", down),
        row("  of scale-up: daemon spawn → /health", timing["daemon_start_to_healthy"]),
    ]
    print(f"{'measurement':44} {'p50/ms':>8} {'p99/ms':>8} {'max/ms':>8}")
    for name, p50, p99, worst in rows:
        print(f"{name:44} {p50:>8} {p99:>8} {worst:>8}")
    build = result["build"]
    print(f"binaries: {build['binary_mb']} total {build['total_mb']} MB")
    if "build_seconds_from_log" in build:
        print(f"build (cold, from log timestamps): {build['build_seconds_from_log']} s")
    print(f"wrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
