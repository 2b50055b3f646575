"""Scheduler benchmark: N sandboxes with random deadlines on a real nats-server (loopback only).

Phases:
1. load: N running records into KV plus N ``created`` events (scheduler not running yet);
2. arm: start the scheduler (a subprocess), time until it has armed every schedule;
3. idle: scheduler CPU and RSS over a quiet window while N schedules wait in NATS;
4. fire: deadlines spread uniformly over [--spread-min, --spread-max] s after arming; lateness
   of every command = JetStream store time of the command - the record's deadline. Split in two:
   when NATS stored the fired timer (``fire_vs_deadline``: negative when the schedule fires
   ahead on purpose, ``SchedulerSettings.fire_lead_seconds``) and the command's time after that
   fire (``command_after_fire``: the fetch, a held early fire's wait, the handler).

Writes bench/results/scheduler.json and prints a table.
``.venv/bin/python bench/scheduler_bench.py --sandboxes 100000``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shared.bus import subjects  # noqa: E402
from shared.bus.server import EmbeddedNats, free_port  # noqa: E402
from shared.bus.topology import (  # noqa: E402
    KV_SANDBOXES,
    SCALER_LIFECYCLE,
    SCHEDULER_FIRED,
    SCHEDULER_LIFECYCLE,
    SNAPSHOTTER_PAUSE,
    STREAM_CMD,
    STREAM_TIMERS,
    ensure_topology,
)
from shared.domain.record import SandboxRecord, SandboxState  # noqa: E402
from shared.models.messages import SandboxCreated  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def mem_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def load_1m() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def publish_all(js, messages, window: int = 1000) -> None:  # type: ignore[no-untyped-def]
    pending = []
    for subject, body in messages:
        pending.append(await js.publish_async(subject, body))
        if len(pending) >= window:
            await asyncio.gather(*pending)
            pending = []
    await asyncio.gather(*pending)


def spread(name: str, values: list[float]) -> dict[str, float | None]:
    if not values:
        return {f"{name}_p50_s": None}
    return {
        f"{name}_p50_s": round(statistics.median(values), 3),
        f"{name}_p99_s": round(pct(values, 99), 3),
        f"{name}_max_s": round(max(values), 3),
    }


async def fire_times(js) -> dict[str, datetime]:  # type: ignore[no-untyped-def]
    """When NATS stored each sandbox's (last) fired timer: the fired copies stay in the timers
    stream (limits retention, their own TTL) after the scheduler acked them."""
    sub = await js.pull_subscribe(
        subjects.of(subjects.TIMER_FIRED, "*"), stream=STREAM_TIMERS, inbox_prefix=b"_INBOX_bench."
    )
    found: dict[str, datetime] = {}
    while True:
        try:
            msgs = await sub.fetch(1000, timeout=2)
        except (TimeoutError, nats.errors.TimeoutError):
            break
        for m in msgs:
            found[subjects.sandbox_id_of(m.subject)] = m.metadata.timestamp
        await asyncio.gather(*(m.ack() for m in msgs))
    await sub.unsubscribe()
    return found


async def consumer_idle(js, stream: str, durable: str) -> bool:  # type: ignore[no-untyped-def]
    info = await js.consumer_info(stream, durable)
    return info.num_pending == 0 and info.num_ack_pending == 0


async def run(args: argparse.Namespace) -> dict[str, object]:
    n = args.sandboxes
    tmp = Path(tempfile.mkdtemp(prefix="sched-bench-"))
    server = EmbeddedNats(data_dir=tmp / "nats").start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        nc = await nats.connect(server.url, max_reconnect_attempts=-1)
        js = nc.jetstream(timeout=30)
        await ensure_topology(js)

        # 1. load: deadlines are placed after the expected arming time (--margin).
        t_load = time.monotonic()
        base = datetime.now(UTC) + timedelta(seconds=args.margin)
        deadlines: dict[str, datetime] = {}
        records = []
        for i in range(n):
            sid = f"b{i:07d}"
            deadline = base + timedelta(seconds=random.uniform(args.spread_min, args.spread_max))
            deadlines[sid] = deadline
            now = datetime.now(UTC)
            records.append(
                SandboxRecord(
                    sandbox_id=sid,
                    owner="bench",
                    state=SandboxState.RUNNING,
                    generation=1,
                    timeout=int(args.spread_max),
                    auto_pause=i % 2 == 0,  # half pause (event + pause + check), half kill
                    created_at=now,
                    started_at=now,
                    deadline=deadline,
                    updated_at=now,
                )
            )
        # Pipelined publishes (a window of acks in flight), not one awaited put at a time.
        await publish_all(
            js,
            ((f"$KV.{KV_SANDBOXES}.{r.sandbox_id}", r.model_dump_json().encode()) for r in records),
        )
        await publish_all(
            js,
            (
                (
                    subjects.of(subjects.EVT_CREATED, r.sandbox_id),
                    SandboxCreated(sandbox_id=r.sandbox_id, generation=1, at=r.created_at)
                    .model_dump_json()
                    .encode(),
                )
                for r in records
            ),
        )
        load_s = time.monotonic() - t_load
        del records
        print(f"loaded {n} records + events in {load_s:.1f}s", flush=True)

        # 2. arm
        port = free_port()
        env = {
            **os.environ,
            "NATS_URL": server.url,
            "PAUSE_RESUME": "true",
            "TORPOR_LOG_LEVEL": "warning",
            "TORPOR_LOG_FORMAT": "json",
            "TORPOR_HEALTH_HOST": "127.0.0.1",
            "TORPOR_HEALTH_PORT": str(port),
            # nobody pauses in the bench: keep checks out
            "TORPOR_TUNING": "SCHEDULER_PAUSE_CHECK_SECONDS=3600",
        }
        log = open(tmp / "scheduler.log", "wb")  # noqa: SIM115
        load_arm = [load_1m()]
        t_arm = time.monotonic()
        for i in range(args.replicas):  # replicas share the durables (one work queue)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "services.scheduler.main"],
                    env={**env, "TORPOR_HEALTH_PORT": str(port if i == 0 else free_port())},
                    stdout=log,
                    stderr=log,
                    cwd=ROOT,
                )
            )
        await asyncio.sleep(1)
        while not await consumer_idle(js, SCHEDULER_LIFECYCLE.stream, SCHEDULER_LIFECYCLE.name):
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("scheduler died; see " + str(tmp / "scheduler.log"))
            await asyncio.sleep(0.5)
        arm_s = time.monotonic() - t_arm
        load_arm.append(load_1m())
        first_deadline = min(deadlines.values())
        slack = (first_deadline - datetime.now(UTC)).total_seconds()
        print(f"armed {n} schedules in {arm_s:.1f}s; first deadline in {slack:.1f}s", flush=True)

        # 3. idle window (must end before the first deadline)
        idle_window = max(0.0, min(args.idle_window, slack - 1))
        rss_idle = sum(mem_kib(p.pid, "VmRSS") for p in procs)
        c0 = sum(cpu_seconds(p.pid) for p in procs)
        await asyncio.sleep(idle_window)
        c1 = sum(cpu_seconds(p.pid) for p in procs)
        idle_cpu = (c1 - c0) / idle_window if idle_window else float("nan")
        print(
            f"idle: {idle_window:.1f}s window, cpu {100 * idle_cpu:.2f}%, rss {rss_idle} KiB",
            flush=True,
        )

        result: dict[str, object] = {
            "sandboxes": n,
            "replicas": args.replicas,
            "spread_s": [args.spread_min, args.spread_max],
            "load_s": round(load_s, 1),
            "arm_s": round(arm_s, 1),
            "arm_rate_per_s": round(n / arm_s),
            "load_1m_arm_start_end": load_arm,
            "idle_window_s": round(idle_window, 1),
            "idle_cpu_pct": round(100 * idle_cpu, 3),
            "rss_idle_mib": round(rss_idle / 1024, 1),
            "cpu_count": os.cpu_count(),
            "nats_sync_always": True,
        }
        if args.no_fire:
            await nc.close()
            result["at"] = datetime.now(UTC).isoformat(timespec="seconds")
            return result

        # 4. fire: wait for the last deadline, then for the fired consumer to drain.
        load_fire = [load_1m()]
        c_fire = sum(cpu_seconds(p.pid) for p in procs)
        t_fire = time.monotonic()
        last = max(deadlines.values())
        while datetime.now(UTC) < last + timedelta(seconds=1) or not await consumer_idle(
            js, SCHEDULER_FIRED.stream, SCHEDULER_FIRED.name
        ):
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("scheduler died; see " + str(tmp / "scheduler.log"))
            await asyncio.sleep(1)
        load_fire.append(load_1m())
        fire_cpu_s = sum(cpu_seconds(p.pid) for p in procs) - c_fire
        fire_wall = time.monotonic() - t_fire
        rss_peak = sum(mem_kib(p.pid, "VmHWM") for p in procs)

        lateness: list[float] = []
        stored: dict[str, datetime] = {}
        seen: set[str] = set()
        duplicates = 0
        for durable in (SNAPSHOTTER_PAUSE, SCALER_LIFECYCLE):
            sub = await js.pull_subscribe_bind(durable.name, stream=STREAM_CMD)
            while True:
                try:
                    # Never more than the durable lets out unacked (else each fetch waits out
                    # its timeout for a full batch).
                    msgs = await sub.fetch(min(1000, durable.max_ack_pending), timeout=2)
                except (TimeoutError, nats.errors.TimeoutError):
                    break
                for m in msgs:
                    sid = subjects.sandbox_id_of(m.subject)
                    if sid in seen:
                        duplicates += 1
                    seen.add(sid)
                    stored[sid] = m.metadata.timestamp
                    lateness.append((m.metadata.timestamp - deadlines[sid]).total_seconds())
                await asyncio.gather(*(m.ack() for m in msgs))
        fired_at = await fire_times(js)
        await nc.close()
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait(30)
        server.stop()
    shutil.rmtree(tmp, ignore_errors=True)  # kept when the run failed (the scheduler's log)

    fire_vs_deadline = [(t - deadlines[sid]).total_seconds() for sid, t in fired_at.items()]
    after_fire = [
        (t - fired_at[sid]).total_seconds() for sid, t in stored.items() if sid in fired_at
    ]
    return {
        **result,
        "rss_peak_mib": round(rss_peak / 1024, 1),
        "fire_phase_cpu_s": round(fire_cpu_s, 1),
        "fire_phase_wall_s": round(fire_wall, 1),
        "load_1m_fire_start_end": load_fire,
        "commands": len(lateness),
        "missing": n - len(seen),
        "duplicates": duplicates,
        "lateness_p50_s": round(statistics.median(lateness), 3) if lateness else None,
        "lateness_p99_s": round(pct(lateness, 99), 3) if lateness else None,
        "lateness_max_s": round(max(lateness), 3) if lateness else None,
        "lateness_min_s": round(min(lateness), 3) if lateness else None,
        **spread("fire_vs_deadline", fire_vs_deadline),
        **spread("command_after_fire", after_fire),
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sandboxes", type=int, default=100_000)
    parser.add_argument("--spread-min", type=float, default=60.0)
    parser.add_argument("--spread-max", type=float, default=120.0)
    parser.add_argument(
        "--margin", type=float, default=None, help="s from load to the spread start"
    )
    parser.add_argument("--idle-window", type=float, default=10.0)
    parser.add_argument("--replicas", type=int, default=1, help="scheduler processes")
    parser.add_argument(
        "--no-fire", action="store_true", help="stop after arming and the idle window"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "scheduler.json")
    args = parser.parse_args()
    if args.margin is None:
        # Load and arming, each measured at a few thousand per second on a quiet machine.
        args.margin = 30 + args.sandboxes / 500
    result = asyncio.run(run(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    width = max(len(k) for k in result)
    print()
    print(f"{'metric':<{width}}  value")
    print(f"{'-' * width}  -----")
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
