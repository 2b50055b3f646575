"""Warm pools: create from the pool and resume into a warm pod, next to a cold pod start.

    .venv/bin/python bench/pool_bench.py --cycles 20

The whole stack runs with ``TORPOR_POOLS=sandbox-base=1`` (nats + the five services, each its
own process, local runtime). One cycle, interleaved so all see the same machine load:

- create (system): ``POST /sandboxes`` → 201 while a warm pod is ready (the ``created`` event
  must say ``path: warm``); then two background processes are started in it (not timed);
- resume (system): pause (not timed), wait until the pool is full again, ``POST
  /sandboxes/{id}/connect`` → 201 (warm pod claimed, kept layer made its root, processes
  replayed; ``lastResume.path`` must be ``warm`` and both processes must run once);
- claim (runtime alone): a second LocalRuntime with its own pool of one: ``create`` →
  ``wait_ready`` of a new workload while a warm pod is ready (the runtime's share of a create);
- cold pod start (runtime alone, the reference): a bare workload scaled 0 → 1 until ready, and
  until its daemon serves ``List`` (as bench/resume_vs_podstart.py).

Ratios: p50(create) ÷ p50(cold pod start) (target ≤ 0.25), p50(resume) ÷ p50(cold pod start)
(target ≤ 0.5), and the same against the daemon serving. Writes ``bench/results/pools_local.json``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from common import (
    STATS_HEADERS,
    USER,
    bench_parser,
    connect,
    create_sandbox,
    kill,
    pause,
    save_result,
    stats_row,
    table,
    torpor_stack,
)
from resume_vs_podstart import (
    COMMANDS,
    KUBERNETES_RIG,
    REAL_NODE,
    TEMPLATE,
    interleaved,
    kubernetes_rig,
    persist_templates,
    raw_kubernetes,
    raw_local,
    real_node_rig,
)

from shared.envd.client import ConnectEnvdClient
from shared.models.snapshots import ProcessConfig
from shared.ports.workloads import Endpoint, WorkloadSpec
from shared.runtime.kubernetes import PodTemplates
from shared.runtime.local import LocalRuntime
from tests.support.pods import release_pods, warm_pods


async def until_warm(probe: Any, within: float = 300.0) -> None:
    deadline = time.monotonic() + within
    while await probe() < 1:
        if time.monotonic() > deadline:
            raise RuntimeError("the pool did not refill")
        await asyncio.sleep(0.05)


async def measure(
    stack: Any, raw: Any, pool_rt: Any | None, cycles: int, system_warm: Any = None
) -> dict[str, Any]:
    """``pool_rt``: a runtime with its own pool of one for the runtime-alone claim (local only);
    ``system_warm``: how many of the stack's pool pods are ready (default: the local runtime's
    records). The loop and the cold reference are bench/resume_vs_podstart.py's."""
    not_warm = bad_replays = 0
    envd = ConnectEnvdClient()
    try:
        await raw()  # warm-up of the bare workload

        async def runtime_warm() -> int:
            assert pool_rt is not None
            return int(await pool_rt.warm_pods(TEMPLATE))

        async def local_warm() -> int:
            return await warm_pods(stack.nats_url)

        system_warm = system_warm or local_warm

        async with stack.aclient(USER) as http, stack.store() as store:

            async def body(n: int) -> dict[str, float] | None:
                nonlocal not_warm, bad_replays
                await until_warm(system_warm)
                t0 = time.perf_counter()
                sid = (await create_sandbox(http))["sandboxID"]
                created = time.perf_counter() - t0
                warm = (await stack.last_event("created", sid)).get("path") == "warm"
                rec = await store.get(sid)
                ep = Endpoint(host=rec.host, pod_uid=rec.pod_uid)
                for command in COMMANDS:
                    await envd.start_process(
                        ep,
                        ProcessConfig(cmd="/bin/bash", args=["-l", "-c", command]),
                        tag=None,
                        access_token=rec.envd_access_token,
                    )
                await pause(http, sid)
                await until_warm(system_warm)
                t0 = time.perf_counter()
                code = await connect(http, sid)
                resumed = time.perf_counter() - t0
                native = (await http.get(f"/api/v1/sandbox/{sid}")).json()
                warm = warm and (native.get("lastResume") or {}).get("path") == "warm"
                rec = await store.get(sid)
                live = await envd.list_processes(
                    Endpoint(host=rec.host, pod_uid=rec.pod_uid),
                    access_token=rec.envd_access_token,
                )
                replayed = sorted(p.config.args[-1] for p in live if p.config.args)
                await kill(http, sid)
                timed = {"create_warm": created, "resume_warm": resumed}
                if pool_rt is not None:
                    await until_warm(runtime_warm)
                    name = f"claim-{uuid.uuid4().hex[:8]}"
                    t0 = time.perf_counter()
                    await pool_rt.create(
                        WorkloadSpec(name=name, owner="bench", access_token=uuid.uuid4().hex)
                    )
                    warm = warm and (await pool_rt.wait_ready(name, timeout=120)).warm
                    timed["claim_runtime"] = time.perf_counter() - t0
                    await pool_rt.delete(name)
                if n < 0:
                    return None  # the untimed warm-up of every path
                if not warm:
                    not_warm += 1
                    return None
                if code != 201 or replayed != sorted(COMMANDS):
                    bad_replays += 1
                return timed

            series = await interleaved(cycles, body, raw, warmups=1)
    finally:
        await envd.close()
    claims = pool_rt is not None
    return {
        "cycles": len(series.samples.get("create_warm", [])),
        "skipped_not_warm": not_warm,
        "bad_replays": bad_replays,
        "processes_per_sandbox": len(COMMANDS),
        **{
            k: series.summary(k)
            for k in ("create_warm", "resume_warm", "claim_runtime", "pod_start", "pod_serving")
        },
        "ratio_create_to_pod_start_p50": series.ratio_p("create_warm", "pod_start"),
        "ratio_resume_to_pod_start_p50": series.ratio_p("resume_warm", "pod_start"),
        "ratio_claim_to_pod_start_p50": (
            series.ratio_p("claim_runtime", "pod_start") if claims else None
        ),
        "ratio_create_to_pod_serving_p50": series.ratio_p("create_warm", "pod_serving"),
        "ratio_resume_to_pod_serving_p50": series.ratio_p("resume_warm", "pod_serving"),
        "load_1m_during": series.load(),
        "samples_s": {k: v for k, v in series.samples_s().items() if k != "pod_stop"},
    }


async def run_local(cycles: int) -> dict[str, Any]:
    env = {"TORPOR_POOLS": f"{TEMPLATE}=1"}
    root = Path(tempfile.mkdtemp(prefix="torpor-bench-pools-"))
    try:
        async with torpor_stack(env=env, root=root) as stack, raw_local(stack) as raw:
            pool_rt = LocalRuntime(
                nats_url=stack.nats_url,
                data_dir=stack.root / "raw-pool",
                bucket=f"bench_pool_{uuid.uuid4().hex[:6]}",
                pools={TEMPLATE: 1},
                poll_interval=0.2,
            )
            await pool_rt.start()
            try:
                return await measure(stack, raw, pool_rt, cycles)
            finally:
                await pool_rt.close()
    finally:
        # The stack kills its pods; the waiting pool pod's mounts are undone here.
        await release_pods(root / "data")
        if os.environ.get("TORPOR_BENCH_KEEP"):  # the stack's logs, for a post-mortem
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


async def run_kubernetes(cycles: int, persist: str = "none", node: str = "test") -> dict[str, Any]:
    """The same on the test rig (kube-apiserver + controller-manager, the test kubelet running
    bubblewrap pods). Pools serve ``persist: none`` and ``persist: store`` templates on
    Kubernetes (``store``: the pause uploads the files to the kept-files store, the resume
    imports them into the warm pod before the replay): the stack's ``sandbox-base`` is
    overridden with that annotation; the cold reference is a bare workload of the same template
    on an emptyDir. ``node="real"``: the same on the real node (kubelet + containerd + runc, the
    sandbox-base image)."""
    from shared.runtime.kubernetes import DEFAULT_TEMPLATES, KubernetesRuntime

    work = Path(tempfile.mkdtemp(prefix="torpor-bench-pools-k8s-"))
    templates = persist_templates(work / "templates", persist)
    # The cold reference: a bare pod of the same template on an emptyDir (the runtime alone has
    # no kept-files store, and the real node no volume provisioner for a claim).
    raw_templates = persist_templates(work / "raw-templates", "none")
    try:
        rig = real_node_rig(work / "node") if node == "real" else kubernetes_rig(work)
        async with rig as kubeconfig:
            env = {
                "TORPOR_KUBECONFIG": str(kubeconfig),
                "TORPOR_NAMESPACE": "torpor-sandboxes",
                "TORPOR_READY_TIMEOUT": "180" if node == "real" else "120",
                "TORPOR_TEMPLATES_DIR": str(templates),
                "TORPOR_POOLS": f"{TEMPLATE}=1",
            }
            async with (
                torpor_stack(runtime="kubernetes", env=env, root=work / "stack") as stack,
                raw_kubernetes(
                    kubeconfig, "bench-raw", PodTemplates(raw_templates, DEFAULT_TEMPLATES)
                ) as raw,
            ):
                observer = await KubernetesRuntime.from_kubeconfig(
                    kubeconfig,
                    namespace="torpor-sandboxes",
                    templates=PodTemplates(templates, DEFAULT_TEMPLATES),
                )
                try:

                    async def warm() -> int:
                        return await observer.warm_pods(TEMPLATE)

                    result = await measure(stack, raw, None, cycles, warm)
                finally:
                    await observer.close()
        plane = REAL_NODE if node == "real" else KUBERNETES_RIG
        result["control_plane"] = f"{plane}; template sandbox-base with persist: {persist}"
        result["node"] = node
        return result
    finally:
        if os.environ.get("TORPOR_BENCH_KEEP"):
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def report(result: dict[str, Any]) -> None:
    print(
        f"\n{result['runtime']} runtime, pool of 1: {result['cycles']} cycles "
        f"({result['skipped_not_warm']} skipped: not warm); load {result['load_1m_during']}"
    )
    rows = [
        stats_row("create from the pool (POST /sandboxes → 201)", result["create_warm"]),
        stats_row("resume into a warm pod (connect → 201, replayed)", result["resume_warm"]),
        *(
            [stats_row("claim (runtime alone: create → ready)", result["claim_runtime"])]
            if result["claim_runtime"]["n"]
            else []
        ),
        stats_row("cold pod start → ready (runtime alone)", result["pod_start"]),
        stats_row("cold pod start → daemon serves List", result["pod_serving"]),
    ]
    print(table(STATS_HEADERS, rows))
    print(
        f"p50 ÷ cold pod start: create {result['ratio_create_to_pod_start_p50']} (target 0.25), "
        f"resume {result['ratio_resume_to_pod_start_p50']} (target 0.5), claim "
        f"{result['ratio_claim_to_pod_start_p50']}; ÷ pod serving: create "
        f"{result['ratio_create_to_pod_serving_p50']}, resume "
        f"{result['ratio_resume_to_pod_serving_p50']}; bad replays {result['bad_replays']}"
    )


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--runtime", choices=("local", "kubernetes"), default="local")
    parser.add_argument(
        "--persist",
        choices=("none", "store"),
        default="none",
        help="kubernetes: the pooled template's torpor.dev/persist (default %(default)s)",
    )
    parser.add_argument(
        "--node",
        choices=("test", "real"),
        default="test",
        help="kubernetes: the test kubelet or the real node (kubelet + containerd; root, "
        "scripts/build-k8s.sh and scripts/build-images.sh)",
    )
    args = parser.parse_args()
    if args.runtime == "local":
        measured = asyncio.run(run_local(args.cycles))
    else:
        measured = asyncio.run(run_kubernetes(args.cycles, args.persist, args.node))
    result = {"runtime": args.runtime, **measured}
    suffix = f" --persist {args.persist} --node {args.node}" if args.runtime == "kubernetes" else ""
    result["command"] = (
        f"bench/pool_bench.py --runtime {args.runtime} --cycles {args.cycles}{suffix}"
    )
    report(result)
    name = (
        f"pools_{args.runtime}"
        + ("_realnode" if args.runtime == "kubernetes" and args.node == "real" else "")
        + ("_store" if args.persist == "store" else "")
    )
    save_result(name, result)


if __name__ == "__main__":
    main()
