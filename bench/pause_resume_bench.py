"""Pause and resume latency end to end through the lifecycle service, next to pod start.

    .venv/bin/python bench/pause_resume_bench.py --cycles 30 --sandboxes 2

What runs: a private nats-server, the snapshotter and the scaler as real processes
(``python -m services.cli run <name>``) on the local runtime (bubblewrap pods), and in this
process the ``SandboxLifecycle`` the api and proxy call. Each sandbox runs two background
processes. One cycle, one sandbox at a time:

- pause:  ``lifecycle.pause`` until the record is ``paused`` (List over envd, annotation,
  snapshot in KV, scale to 0, pod gone);
- resume: ``lifecycle.resume`` until ``running`` (scale to 1, new pod ready, processes replayed);
- not timed: the new pod's process list must hold each snapshotted command exactly once;
- pod start (the physical floor): a bare workload of the same runtime (its own bucket and
  addresses) scaled 0 → 1 until its daemon answers ``/health``, then back to 0.

Pause, resume and pod start are interleaved so they see the same machine load. Prints a table and
writes ``bench/results/pause_resume_local.json``; ``bench/results/pod_start_local.json`` (from
``bench/pod_start_bench.py``), if present, is quoted for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from shared.bus.broker import key_value, make_broker, prepare  # noqa: E402
from shared.bus.publishing import BrokerPublisher  # noqa: E402
from shared.bus.records import KvSandboxStore  # noqa: E402
from shared.bus.topology import KV_SANDBOXES  # noqa: E402
from shared.envd.client import ConnectEnvdClient  # noqa: E402
from shared.lifecycle.replay import duplicates  # noqa: E402
from shared.lifecycle.service import SandboxLifecycle  # noqa: E402
from shared.logging import configure  # noqa: E402
from shared.models.snapshots import ProcessConfig  # noqa: E402
from shared.ports.lifecycle import CreateRequest  # noqa: E402
from shared.ports.workloads import Endpoint, WorkloadSpec  # noqa: E402
from shared.runtime.local import LocalRuntime  # noqa: E402
from shared.settings import BusSettings, LoggingSettings  # noqa: E402
from tests.support.stack import Stack  # noqa: E402

configure(LoggingSettings(log_level="warning"), service="bench")

RESULTS = REPO / "bench" / "results"
COMMANDS = ["exec sleep 100001", "python3 -c 'import time; time.sleep(100002)'"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def summary(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), 1),
        "p90_ms": round(percentile(ms, 90), 1),
        "p99_ms": round(percentile(ms, 99), 1),
        "min_ms": round(min(ms), 1),
        "max_ms": round(max(ms), 1),
        "mean_ms": round(sum(ms) / len(ms), 1),
    }


async def load_1m() -> float:
    return os.getloadavg()[0]


async def run(cycles: int, sandboxes: int) -> dict[str, Any]:
    if shutil.which("bwrap") is None:
        raise SystemExit("bubblewrap (bwrap) is required: apt-get install -y bubblewrap")
    tmp = Path(tempfile.mkdtemp(prefix="torpor-prbench-"))
    # info: the scaler's ``resume_timing`` lines give the per-phase breakdown below.
    workers = Stack(
        tmp,
        services=("snapshotter", "scaler"),
        users={},
        log_level="warning",
        env_of={"scaler": {"TORPOR_LOG_LEVEL": "info"}},
        data_dir=tmp / "rt",
        log_dir=tmp,
    )
    pause_s: list[float] = []
    resume_s: list[float] = []
    pod_start_s: list[float] = []
    bad_replays = 0
    loads: list[float] = []
    phases: dict[str, dict[str, float]] = {}
    try:
        async with workers:
            bus = BusSettings(nats_url=workers.nats_url)
            client = make_broker(bus, service="bench")
            envd = ConnectEnvdClient()
            floor = LocalRuntime(
                nats_url=workers.nats_url,
                data_dir=tmp / "podstart",
                bucket="bench_podstart",
                stop_pods_on_close=True,
            )
            try:
                await prepare(client, bus)
                await client.start()
                await floor.start()
                await floor.create(WorkloadSpec(name="floor", owner="bench", replicas=0))
                store = KvSandboxStore(await key_value(client, KV_SANDBOXES))
                lifecycle = SandboxLifecycle(store, BrokerPublisher(client))
                sids = [f"bench-{i}" for i in range(sandboxes)]
                for sid in sids:
                    request = CreateRequest(owner="bench", sandbox_id=sid)
                    rec = await lifecycle.create(request, wait=120)
                    assert rec.host is not None
                    assert rec.pod_uid is not None
                    for command in COMMANDS:
                        await envd.start_process(
                            Endpoint(host=rec.host, pod_uid=rec.pod_uid),
                            ProcessConfig(
                                cmd="/bin/bash", args=["-l", "-c", command], cwd="/workspace"
                            ),
                            tag=None,
                            access_token=rec.envd_access_token,
                        )
                for cycle in range(cycles):
                    sid = sids[cycle % len(sids)]
                    t0 = time.perf_counter()
                    await lifecycle.pause(sid, owner="bench", wait=120)
                    t1 = time.perf_counter()
                    result = await lifecycle.resume(sid, owner="bench", wait=120)
                    t2 = time.perf_counter()
                    pause_s.append(t1 - t0)
                    resume_s.append(t2 - t1)
                    rec = result.record
                    assert rec.host is not None
                    assert rec.pod_uid is not None
                    live = await envd.list_processes(
                        Endpoint(host=rec.host, pod_uid=rec.pod_uid),
                        access_token=rec.envd_access_token,
                    )
                    replayed = sorted(p.config.args[-1] for p in live)
                    if duplicates(live) or replayed != sorted(COMMANDS):
                        bad_replays += 1
                    t3 = time.perf_counter()
                    await floor.scale("floor", 1)
                    await floor.wait_ready("floor", timeout=120)
                    pod_start_s.append(time.perf_counter() - t3)
                    await floor.scale("floor", 0)
                    await floor.wait_stopped("floor", timeout=60)
                    loads.append(await load_1m())
                    print(
                        f"cycle {cycle + 1:3d}/{cycles}  pause {pause_s[-1] * 1000:7.1f} ms  "
                        f"resume {resume_s[-1] * 1000:7.1f} ms  "
                        f"pod start {pod_start_s[-1] * 1000:7.1f} ms",
                        flush=True,
                    )
                for sid in sids:
                    await lifecycle.kill(sid, owner="bench", wait=60)
            finally:
                workers.stop_services()
                phases = resume_phases(tmp / "scaler.log")
                await floor.close()
                # The workers never stop pods (by design): a last supervisor on their data dir does.
                with contextlib.suppress(Exception):
                    async with workers.observer():
                        pass
                await envd.close()
                await client.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    pause, resume, pod = summary(pause_s), summary(resume_s), summary(pod_start_s)
    out: dict[str, Any] = {
        "benchmark": "pause_resume_local",
        "path": "SandboxLifecycle -> NATS -> snapshotter/scaler processes -> local runtime + envd",
        "cycles": cycles,
        "sandboxes": sandboxes,
        "processes_per_sandbox": len(COMMANDS),
        "pause": pause,
        "resume": resume,
        "pod_start": pod,
        "ratio_resume_to_pod_start_p50": round(resume["p50_ms"] / pod["p50_ms"], 3),
        "ratio_resume_to_pod_start_p99": round(resume["p99_ms"] / pod["p99_ms"], 3),
        "bad_replays": bad_replays,
        "resume_phases_in_scaler": phases,
        "load_1m_during": {"min": min(loads), "max": max(loads)} if loads else {},
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    reference = RESULTS / "pod_start_local.json"
    if reference.exists():
        ref = json.loads(reference.read_text())
        start = ref.get("start_to_ready", {})
        out["pod_start_bench_reference"] = {
            "file": str(reference.relative_to(REPO)),
            "p50_ms": start.get("p50_ms"),
            "p99_ms": start.get("p99_ms"),
            "ratio_resume_p50_to_it": round(resume["p50_ms"] / start["p50_ms"], 3)
            if start.get("p50_ms")
            else None,
        }
    return out


def resume_phases(log: Path) -> dict[str, dict[str, float]]:
    """p50/p99 of each phase the scaler logs per resume (``resume_timing``): ``queued`` (stream
    to handler), ``claim`` (CAS to resuming), ``scale``, ``ready`` (new pod's daemon answers),
    ``replay`` (List + Start of each process + replay mark), ``commit`` (CAS to running),
    ``publish`` (the resumed event)."""
    samples: dict[str, list[float]] = {}
    with contextlib.suppress(OSError):
        for line in log.read_text(errors="replace").splitlines():
            if '"resume_timing"' not in line:
                continue
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                for key, value in entry.items():
                    if key.endswith("_ms") and isinstance(value, int | float):
                        samples.setdefault(key.removesuffix("_ms"), []).append(value / 1000)
    return {
        name: {k: v for k, v in summary(values).items() if k in ("n", "p50_ms", "p99_ms")}
        for name, values in samples.items()
    }


def table(result: dict[str, Any]) -> str:
    rows = [
        ("pause", result["pause"]),
        ("resume", result["resume"]),
        ("pod start", result["pod_start"]),
    ]
    lines = [f"{'':10} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} {'max ms':>9}"]
    lines += [
        f"{name:10} {s['p50_ms']:9.1f} {s['p90_ms']:9.1f} {s['p99_ms']:9.1f} {s['max_ms']:9.1f}"
        for name, s in rows
    ]
    lines.append(
        f"resume / pod start: p50 {result['ratio_resume_to_pod_start_p50']:.2f}x, "
        f"p99 {result['ratio_resume_to_pod_start_p99']:.2f}x; bad replays: {result['bad_replays']}"
    )
    phases = result.get("resume_phases_in_scaler") or {}
    if phases:
        lines.append(
            "resume phases in the scaler (p50/p99 ms): "
            + ", ".join(f"{k} {v['p50_ms']:.0f}/{v['p99_ms']:.0f}" for k, v in phases.items())
        )
    lines.append(f"load average (1 min) during the run: {result['load_1m_during']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--sandboxes", type=int, default=2)
    args = parser.parse_args()
    result = asyncio.run(run(args.cycles, args.sandboxes))
    print(table(result))
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "pause_resume_local.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path.relative_to(REPO)}")


if __name__ == "__main__":
    main()
