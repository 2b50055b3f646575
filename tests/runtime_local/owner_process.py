"""A process that owns a LocalRuntime with one running pod, for kill -9 tests.

Prints ``ENDPOINTS <json>`` once its pods are ready (logs go to stdout too), then sleeps until
killed. With ``--pool TEMPLATE=N`` it keeps a warm pool, and with ``--burst NAME`` it creates
those workloads all at once (without waiting for them) after printing ``POOL READY``: claims
in flight for a kill -9.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from shared.ports.workloads import WorkloadSpec
from shared.runtime.local import LocalRuntime
from shared.settings import parse_pools


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--templates-dir", type=Path, default=None)
    parser.add_argument("--name", action="append", default=[])
    parser.add_argument("--pool", default="")
    parser.add_argument("--burst", action="append", default=[])
    args = parser.parse_args()
    pools = parse_pools(args.pool)
    runtime = LocalRuntime(
        nats_url=args.nats_url,
        data_dir=args.data_dir,
        bucket=args.bucket,
        templates_dir=args.templates_dir,
        pools=pools,
        poll_interval=0.2,
    )
    await runtime.start()
    for template, size in pools.items():
        while await runtime.warm_pods(template) < size:
            await asyncio.sleep(0.1)
    if pools:
        print("POOL READY", flush=True)
    await asyncio.gather(
        *(
            runtime.create(WorkloadSpec(name=n, owner="alice", access_token=f"token-{n}"))
            for n in args.burst
        )
    )
    endpoints = {}
    for name in args.name:
        await runtime.create(WorkloadSpec(name=name, owner="alice", replicas=1))
        endpoints[name] = (await runtime.wait_ready(name, timeout=30)).model_dump()
    print("ENDPOINTS", json.dumps(endpoints), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
