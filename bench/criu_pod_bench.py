"""CRIU checkpoint of a local pod (user namespace included) versus its memory size.

For each size: one cold start of the counter pod (tests/support/counter_pod.py: bwrap PID 1 in the
pod's namespaces, a process touching N MiB at start; create→ready timed, the reference a memory
restore competes with), then ``--cycles`` rounds of ``Criu.dump`` and ``Criu.restore``
(shared/runtime/local/checkpoint.py) into the same pod root and network namespace, each restore
checked (same in-memory secret and pid, the count goes on). The first dump is of the pod as
started (its user namespace owned by the pod's id range: CRIU runs as that owner), later ones
of a restored tree (owned by root). Images on the data dir's file system (page cache, no
fsync). Embedded nats-server, loopback only.

    .venv/bin/python bench/criu_pod_bench.py [--sizes 64,256,1024] [--cycles 5]
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import STATS_HEADERS, bench_parser, save_result, stats_row, summary, table
from shared.bus.server import EmbeddedNats
from shared.logging import configure
from shared.ports.workloads import WorkloadSpec
from shared.runtime.local import LocalRuntime, checkpoint, procfs
from shared.runtime.local.network import PodNetwork
from shared.runtime.local.network.names import pod_net_id
from shared.runtime.local.network.podnet import release_instance
from shared.settings import LoggingSettings
from tests.support import counter_pod
from tests.support.pods import release_pods


async def one_size(criu: str, mib: int, cycles: int, work: Path, nats_url: str) -> dict[str, Any]:
    data_dir = work / f"runtime-{mib}"
    runtime = LocalRuntime(
        nats_url=nats_url,
        data_dir=data_dir,
        bucket=f"bench_{uuid.uuid4().hex[:8]}",
        templates_dir=counter_pod.write_template(work / f"templates-{mib}", mib=mib),
        stop_pods_on_close=False,  # no reconciler may restart the pod while it is dumped
    )
    await runtime.start()
    name = f"bench-{uuid.uuid4().hex[:8]}"
    began = time.perf_counter()
    await runtime.create(WorkloadSpec(name=name, owner="bench", template=counter_pod.TEMPLATE))
    ep = await runtime.wait_ready(name, timeout=120)
    cold = time.perf_counter() - began
    _, secret, pid_inside = await counter_pod.ask(ep)
    await runtime.close()
    [outer] = [p.pid for p in procfs.scan_pods(data_dir) if p.uid == ep.pod_uid]
    pid = procfs.inner_pid(outer)
    assert pid is not None
    enter = PodNetwork(data_dir).enter_prefix(pod_net_id(ep.pod_uid))
    root = data_dir / "pods" / ep.pod_uid / "root"
    criu_ = checkpoint.Criu(criu)
    dumps, restores, image_mib = [], [], []
    try:
        for i in range(cycles):
            images = work / f"images-{mib}-{i}"
            t0 = time.perf_counter()
            await criu_.dump(checkpoint.PodTree(pid=pid, enter=enter), images)
            dumps.append(time.perf_counter() - t0)
            image_mib.append(sum(e.stat().st_size for e in images.iterdir()) / 2**20)
            read_end, write_end = os.pipe()
            try:
                target = checkpoint.RestoreTarget(root=root, enter=enter, output_fd=write_end)
                t0 = time.perf_counter()
                pid = await criu_.restore(target, images)
                restores.append(time.perf_counter() - t0)
            finally:
                _close(write_end, read_end)
            _, same_secret, same_pid = await counter_pod.ask(ep)
            assert (same_secret, same_pid) == (secret, pid_inside), "memory not restored"
            shutil.rmtree(images)
    finally:
        await release_pods(data_dir)
        await release_instance(data_dir)
    return {
        "mib": mib,
        "cold_start_s": round(cold, 3),
        "dump": summary(dumps),
        "restore": summary(restores),
        "image_mib": round(max(image_mib), 1),
        "restore_per_cold_start": round(sorted(restores)[len(restores) // 2] / cold, 3),
    }


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


async def run(sizes: list[int], cycles: int, work: Path) -> list[dict[str, Any]]:
    criu = checkpoint.default_criu()
    capability = await checkpoint.probe(criu)
    if not capability.available or criu is None:
        raise SystemExit(f"CRIU is not usable here: {capability.reason}")
    server = EmbeddedNats(data_dir=work / "nats").start()
    try:
        return [await one_size(criu, mib, cycles, work, server.url) for mib in sizes]
    finally:
        server.stop()


def main() -> None:
    configure(LoggingSettings(log_level="warning"), service="bench")
    parser = bench_parser(__doc__, out="criu_pod")
    parser.add_argument("--sizes", default="64,256,1024", help="MiB, comma-separated")
    parser.add_argument("--cycles", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="torpor-criu-bench-") as tmp:
        rows = asyncio.run(run(sizes, args.cycles, Path(tmp)))
    lines = []
    for row in rows:
        lines.append(stats_row(f"{row['mib']} MiB dump", row["dump"]))
        lines.append(stats_row(f"{row['mib']} MiB restore", row["restore"]))
    print(table(STATS_HEADERS, lines))
    for row in rows:
        print(
            f"{row['mib']} MiB: image {row['image_mib']} MiB, cold start {row['cold_start_s']} s,"
            f" restore p50 / cold start {row['restore_per_cold_start']}"
        )
    save_result(args.out, {"cycles": args.cycles, "sizes": rows})


if __name__ == "__main__":
    main()
