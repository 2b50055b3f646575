"""A process that owns a LocalRuntime with one running pod, for kill -9 tests.

Prints ``ENDPOINTS <json>`` once its pods are ready (logs go to stdout too), then sleeps until
killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from shared.ports.workloads import WorkloadSpec
from shared.runtime.local import LocalRuntime


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--templates-dir", type=Path, default=None)
    parser.add_argument("--name", action="append", required=True)
    args = parser.parse_args()
    runtime = LocalRuntime(
        nats_url=args.nats_url,
        data_dir=args.data_dir,
        bucket=args.bucket,
        templates_dir=args.templates_dir,
    )
    await runtime.start()
    endpoints = {}
    for name in args.name:
        await runtime.create(WorkloadSpec(name=name, owner="alice", replicas=1))
        endpoints[name] = (await runtime.wait_ready(name, timeout=30)).model_dump()
    print("ENDPOINTS", json.dumps(endpoints), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
