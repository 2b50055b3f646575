"""Local runtime: pause and resume latency against how much the sandbox changed on its disk.

With ``persist: layer`` (the default) a pause keeps the sandbox's writable layer: the pod stops
and its ext4 image is unmounted (which writes back what is still dirty in the page cache); a
resume mounts it again under a new pod. Nothing is copied, so the question is what the changed
data costs at those two points. Each cycle, per size (empty, 100 MiB, 1 GiB by default):

- untimed: the sandbox writes ``size`` fresh random bytes into ``/home/user/blob`` (``head -c
  … /dev/urandom``, through its daemon), and a marker when done;
- pause: ``scale(0)`` + ``wait_stopped`` (pod gone, layer unmounted) — timed;
- resume: ``scale(1)`` + ``wait_ready`` (image mounted, overlay, new pod's daemon answers) — timed;
- untimed: the blob is checked (size) in the new pod's root.

Embedded nats-server, loopback only, the packaged ``sandbox-base`` template (2 GiB disk).

    .venv/bin/python bench/kept_layer_bench.py [--cycles 3] [--sizes 0,100,1024]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path

from common import STATS_HEADERS, loadavg, stats_row, summary, table, write_result

from shared.bus.server import EmbeddedNats
from shared.envd.client import ConnectEnvdClient
from shared.logging import configure
from shared.models.snapshots import ProcessConfig
from shared.ports.workloads import WorkloadSpec
from shared.runtime.local import LocalRuntime
from shared.settings import LoggingSettings

MIB = 2**20


async def _write(
    envd: ConnectEnvdClient, runtime: LocalRuntime, name: str, size: int, pods: Path
) -> None:
    endpoint = await runtime.wait_ready(name, timeout=120)
    script = f"rm -f done; head -c {size} /dev/urandom > blob && touch done"
    config = ProcessConfig(cmd="/bin/sh", args=["-c", script], cwd="/home/user")
    await envd.start_process(endpoint, config, tag=None, access_token=None)
    done = pods / str(endpoint.pod_uid) / "root" / "home" / "user" / "done"
    deadline = time.monotonic() + 600
    while not done.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"writing {size} bytes did not finish")
        await asyncio.sleep(0.1)


async def run(cycles: int, sizes: list[int], work: Path) -> dict[str, object]:
    server = EmbeddedNats(data_dir=work / "nats").start()
    runtime = LocalRuntime(
        nats_url=server.url, data_dir=work / "runtime", bucket=f"bench_{uuid.uuid4().hex[:8]}"
    )
    envd = ConnectEnvdClient()
    pods = work / "runtime" / "pods"
    results: dict[str, object] = {}
    try:
        await runtime.start()
        for size in sizes:
            name = f"kept-{size // MIB}m-{uuid.uuid4().hex[:6]}"
            await runtime.create(WorkloadSpec(name=name, owner="bench", replicas=1))
            pauses: list[float] = []
            resumes: list[float] = []
            for _ in range(cycles):
                if size:
                    await _write(envd, runtime, name, size, pods)
                else:
                    await runtime.wait_ready(name, timeout=120)
                began = time.perf_counter()
                await runtime.scale(name, 0)
                await runtime.wait_stopped(name, timeout=600)
                pauses.append(time.perf_counter() - began)
                began = time.perf_counter()
                await runtime.scale(name, 1)
                endpoint = await runtime.wait_ready(name, timeout=600)
                resumes.append(time.perf_counter() - began)
                blob = pods / str(endpoint.pod_uid) / "root" / "home" / "user" / "blob"
                kept = blob.stat().st_size if blob.exists() else 0
                if kept != size:
                    raise SystemExit(f"{name}: {kept} bytes after resume, wrote {size}")
            await runtime.delete(name)
            results[f"{size // MIB} MiB"] = {"pause": summary(pauses), "resume": summary(resumes)}
    finally:
        await envd.close()
        await runtime.close()
        server.stop()
    return {"cycles": cycles, "sizes_mib": [s // MIB for s in sizes], "results": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--sizes", default="0,100,1024", help="MiB, comma-separated")
    args = parser.parse_args()
    configure(LoggingSettings(log_level="warning"), service="bench")
    sizes = [int(s) * MIB for s in args.sizes.split(",")]
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="torpor-kept-") as tmp:
        data = asyncio.run(run(args.cycles, sizes, Path(tmp)))
    data["load_before"] = load_before
    data["load_after"] = loadavg()
    path = write_result("kept_layer_local", data)
    rows = []
    for label, stats in data["results"].items():  # type: ignore[attr-defined]
        rows.append(stats_row(f"pause, {label} changed", stats["pause"]))
        rows.append(stats_row(f"resume, {label} changed", stats["resume"]))
    print(table(STATS_HEADERS, rows))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
