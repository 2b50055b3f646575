"""A scaler's part in warm pools on Kubernetes, as a process of its own, for kill -9 tests.

Keeps ``--pool TEMPLATE=N`` filled (never sweeping abandoned claims itself: that is the restarted
scaler's job), first creates the ``--resume`` sandboxes and stops them, waits until the pool is
full and prints ``POOL READY``, then issues the ``--create`` creates and the ``--resume`` resumes
all at once: claims in flight for a kill -9 (the runtime logs ``k8s_pool_claim_taken`` to stdout
after a claim's first step). ``--slow-bind S``: the daemon binding of a claimed pod starts S
seconds late (a slow daemon), so a kill after that line lands between the claim and the bind.
Every sandbox's token is ``tok-<name>``.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from shared.ports.workloads import WorkloadSpec
from shared.runtime.kubernetes import DEFAULT_TEMPLATES, KubernetesRuntime, PodTemplates
from shared.settings import parse_pools


def spec(name: str, template: str) -> WorkloadSpec:
    return WorkloadSpec(
        name=name, owner="alice", template=template, envs={"WHO": name}, access_token=f"tok-{name}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--templates-dir", type=Path, required=True)
    parser.add_argument("--pool", required=True)
    parser.add_argument("--create", action="append", default=[])
    parser.add_argument("--resume", action="append", default=[])
    parser.add_argument("--slow-bind", type=float, default=0.0)
    args = parser.parse_args()
    pools = parse_pools(args.pool)
    ((template, size),) = pools.items()
    runtime = await KubernetesRuntime.from_kubeconfig(
        args.kubeconfig,
        namespace=args.namespace,
        templates=PodTemplates(args.templates_dir, DEFAULT_TEMPLATES),
        pools=pools,
    )
    runtime.start_pools(interval=0.2, claim_timeout=3600)
    for name in args.resume:
        await runtime.create(spec(name, template))
        await runtime.wait_ready(name, timeout=120)
        await runtime.scale(name, 0)
        await runtime.wait_stopped(name, timeout=120)
    while await runtime.warm_pods(template) < size:
        await asyncio.sleep(0.2)
    if args.slow_bind:
        bind = runtime._bind

        async def slow_bind(*a: Any) -> None:
            await asyncio.sleep(args.slow_bind)
            await bind(*a)

        runtime._bind = slow_bind  # type: ignore[method-assign]
    print("POOL READY", flush=True)
    await asyncio.gather(
        *(runtime.create(spec(n, template)) for n in args.create),
        *(runtime.scale(n, 1) for n in args.resume),
    )
    print("BURST DONE", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
