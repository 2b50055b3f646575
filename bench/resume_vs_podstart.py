"""Resume and pause latency of the whole system next to pod start→ready of the runtime alone.

    .venv/bin/python bench/resume_vs_podstart.py --runtime local --cycles 100
    .venv/bin/python bench/resume_vs_podstart.py --runtime kubernetes --cycles 100
    .venv/bin/python bench/resume_vs_podstart.py --runtime kubernetes --node real --cycles 30
    .venv/bin/python bench/resume_vs_podstart.py --runtime kubernetes --node real --persist store
    .venv/bin/python bench/resume_vs_podstart.py --chart-only

The whole stack runs (nats + api + proxy + scheduler + snapshotter + scaler, each its own
process). A few sandboxes each run two background processes. One cycle, on one sandbox at a time:

- pause:  ``POST /sandboxes/{id}/pause`` → 204 (snapshot over envd, annotation, scale to 0, pod
  gone);
- resume: ``POST /sandboxes/{id}/connect`` → 201 (scale to 1, new pod ready, processes replayed;
  the scaler marks the record running only after replay, and connect waits for that);
- then, not timed, the daemon's process list is checked: each snapshotted command exactly once;
- pod start (the physical limit): on the same runtime, a separate bare workload is scaled
  0 → 1 and timed until its pod is ready (daemon answers /health), then scaled back to 0.

The two are interleaved, so both see the same machine load. ``--gap S`` idles S seconds before
each timed start (resume and bare pod alike): a real sandbox sits paused for a while, so the
previous pod's teardown is not part of its resume (default 0: resume right after the pause).

On the real node (kubelet + containerd) there is no volume provisioner, so nothing there may use
a claim (``persist: layer``, the packaged ``sandbox-base``): the stack's ``sandbox-base`` is
annotated ``--persist none`` (default there) or ``store``, and the bare pod is the same template
on an emptyDir (``persist: none``; the runtime alone has no kept-files store), as in
bench/pool_bench.py.

The bare pod is timed twice: until the runtime calls it ready (its daemon's ``/health`` answers,
which it does as soon as it binds) and until the daemon serves its process API (first ``List``
answered, after its app is imported) — a resume needs the latter. The ratios are p50(resume) ÷
p50(pod ready) and ÷ p50(pod serving) (and the same for p99).

Writes ``bench/results/resume_<runtime>.json`` and redraws ``bench/results/resume_vs_podstart.png``
from whichever result files exist.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

from common import (
    RESULTS,
    STATS_HEADERS,
    USER,
    Stack,
    bench_parser,
    connect,
    create_sandbox,
    loadavg,
    pause,
    ratio,
    save_result,
    start_commands,
    stats_row,
    summary,
    table,
    torpor_stack,
)

from shared.envd.client import ConnectEnvdClient
from shared.ports.workloads import Endpoint, WorkloadSpec

COMMANDS = ["exec sleep 100001", "exec sleep 100002"]
TEMPLATE = "sandbox-base"
CHART = RESULTS / "resume_vs_podstart.png"

# (start → /health ready, start → daemon serving its API, stop) in seconds
RawCycle = Callable[[], Coroutine[Any, Any, tuple[float, float, float]]]


# ---------------------------------------------------------------- the runtime alone


@contextlib.asynccontextmanager
async def raw_local(stack: Stack) -> AsyncIterator[RawCycle]:
    from shared.runtime.local import LocalRuntime

    runtime = LocalRuntime(
        nats_url=stack.nats_url,
        data_dir=stack.root / "raw",
        bucket=f"bench_raw_{uuid.uuid4().hex[:6]}",
    )
    await runtime.start()
    try:
        async with _raw_cycles(runtime) as cycle:
            yield cycle
    finally:
        await runtime.close()


@contextlib.asynccontextmanager
async def raw_kubernetes(
    kubeconfig: Path, namespace: str, templates: Any = None
) -> AsyncIterator[RawCycle]:
    """Bare workloads of ``templates`` (a ``PodTemplates``; the packaged ones when ``None``)."""
    from shared.runtime.kubernetes import KubernetesRuntime

    extra = {} if templates is None else {"templates": templates}
    runtime = await KubernetesRuntime.from_kubeconfig(kubeconfig, namespace=namespace, **extra)
    try:
        async with _raw_cycles(runtime) as cycle:
            yield cycle
    finally:
        await runtime.close()


def persist_templates(folder: Path, mode: str) -> Path:
    """``folder`` with the packaged ``sandbox-base`` annotated ``torpor.dev/persist: <mode>``
    (for ``TORPOR_TEMPLATES_DIR`` or ``PodTemplates``, ahead of the packaged ones)."""
    import yaml

    from shared.runtime.kubernetes import DEFAULT_TEMPLATES
    from shared.runtime.kubernetes.objects import ANNOTATION_PERSIST

    doc: dict[str, Any] = yaml.safe_load((DEFAULT_TEMPLATES / f"{TEMPLATE}.yaml").read_text())
    annotations = doc["template"].setdefault("metadata", {}).setdefault("annotations", {})
    annotations[ANNOTATION_PERSIST] = mode
    folder.mkdir(parents=True)
    (folder / f"{TEMPLATE}.yaml").write_text(yaml.safe_dump(doc))
    return folder


@contextlib.asynccontextmanager
async def _raw_cycles(runtime: Any) -> AsyncIterator[RawCycle]:
    name = f"raw-{uuid.uuid4().hex[:8]}"
    await runtime.create(WorkloadSpec(name=name, owner="bench-raw", replicas=0))

    envd = ConnectEnvdClient()

    async def cycle() -> tuple[float, float, float]:
        t0 = time.perf_counter()
        await runtime.scale(name, 1)
        endpoint = await runtime.wait_ready(name, timeout=120)
        ready = time.perf_counter() - t0
        # The daemon answers /health as soon as it binds, before its app is imported: a
        # resume needs the process API, so also time the first answered List.
        for _ in range(600):
            try:
                await envd.list_processes(endpoint, access_token=None, timeout=10)
                break
            except Exception:
                await asyncio.sleep(0.02)
        serving = time.perf_counter() - t0
        t0 = time.perf_counter()
        await runtime.scale(name, 0)
        await runtime.wait_stopped(name, timeout=120)
        return ready, serving, time.perf_counter() - t0

    try:
        yield cycle
    finally:
        await envd.close()
        await runtime.delete(name)


# ---------------------------------------------------------------- the interleaved loop


class Series:
    """The samples of one run by name (seconds), and the machine's 1-minute load per cycle."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}
        self.loads: list[float] = []
        self.skipped = 0

    def summary(self, name: str) -> dict[str, float]:
        return summary(self.samples.get(name, []))

    def ratio_p(self, a: str, b: str, p: int = 50) -> float:
        return ratio(self.summary(a)[f"p{p}_ms"], self.summary(b)[f"p{p}_ms"])

    def load(self) -> dict[str, float]:
        loads = self.loads or [0.0]
        return {"min": min(loads), "max": max(loads), "mean": round(sum(loads) / len(loads), 2)}

    def samples_s(self) -> dict[str, list[float]]:
        return {k: [round(x, 4) for x in v] for k, v in self.samples.items()}


# One timed cycle of the system: its samples by name (seconds), or None to leave it out.
Body = Callable[[int], Coroutine[Any, Any, dict[str, float] | None]]


async def interleaved(
    cycles: int, body: Body, raw: RawCycle, *, gap: float = 0.0, warmups: int = 0
) -> Series:
    """Each cycle: the system's ``body``, then (after ``gap``) a cold pod start of the runtime
    alone (``pod_start``, ``pod_serving``, ``pod_stop``), so both see the same machine load.
    Cycles numbered below 0 (``warmups`` of them) run but are not kept."""
    series = Series()
    for n in range(-warmups, cycles):
        timed = await body(n)
        await asyncio.sleep(gap)
        started, served, stopped = await raw()
        if n < 0:
            continue
        if timed is None:
            series.skipped += 1
            continue
        timed = {**timed, "pod_start": started, "pod_serving": served, "pod_stop": stopped}
        for key, value in timed.items():
            series.samples.setdefault(key, []).append(value)
        series.loads.append(loadavg()[0])
        shown = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in timed.items())
        print(f"  {n + 1}/{cycles}: {shown}, load {series.loads[-1]}", flush=True)
    return series


@contextlib.asynccontextmanager
async def kubernetes_rig(work: Path) -> AsyncIterator[Path]:
    """The Kubernetes test rig (tests/support/k8s/rig.py: etcd, kube-apiserver,
    controller-manager; the test kubelet running bubblewrap pods) with namespaces
    ``torpor-sandboxes`` and ``bench-raw``; yields its kubeconfig."""
    from tests.support.k8s.kubelet import TestKubelet
    from tests.support.k8s.plugin import admin_client, create_namespace
    from tests.support.k8s.rig import ControlPlane, ensure_binaries

    plane = await asyncio.to_thread(
        ControlPlane(bin_dir=ensure_binaries(build=False), workdir=work / "plane").start
    )
    kubelet = await asyncio.to_thread(
        TestKubelet(kubeconfig=plane.kubeconfig, workdir=work / "kubelet").start
    )
    try:
        admin = await admin_client(plane.kubeconfig)
        try:
            for ns in ("torpor-sandboxes", "bench-raw"):
                await create_namespace(admin, ns)
        finally:
            await admin.close()  # type: ignore[no-untyped-call]
        yield Path(plane.kubeconfig)
    finally:
        await asyncio.to_thread(kubelet.stop)
        await asyncio.to_thread(plane.stop)


KUBERNETES_RIG = "etcd + kube-apiserver + kube-controller-manager (tests/support/k8s/rig.py), "
KUBERNETES_RIG += "test kubelet (bubblewrap pods)"


# ---------------------------------------------------------------- the whole system


async def seed(stack: Stack, envd: ConnectEnvdClient, count: int) -> list[str]:
    ids = []
    async with stack.aclient(USER) as http, stack.store() as store:
        for _ in range(count):
            sbx = await create_sandbox(http)
            sid = sbx["sandboxID"]
            rec = await store.get(sid)
            await start_commands(envd, rec, COMMANDS)
            ids.append(sid)
    return ids


async def replayed_once(store: Any, envd: ConnectEnvdClient, sid: str) -> bool:
    rec = await store.get(sid)
    live = await envd.list_processes(
        Endpoint(host=rec.host, pod_uid=rec.pod_uid), access_token=rec.envd_access_token
    )
    commands = [p.config.args[-1] for p in live if p.config.args]
    return sorted(commands) == sorted(COMMANDS)


async def measure(
    stack: Stack, raw: RawCycle, cycles: int, sandboxes: int, gap: float = 0.0
) -> dict[str, Any]:
    envd = ConnectEnvdClient()
    stamps: list[float] = []  # wall clock at each resume call, to find a slow cycle in the logs
    bad_replays = 0
    try:
        ids = await seed(stack, envd, sandboxes)
        await raw()  # warm-up of the bare workload (first pod start pays imports and caches)
        async with stack.aclient(USER) as http, stack.store() as store:
            for sid in ids:  # and one untimed cycle per sandbox
                await pause(http, sid)
                await connect(http, sid)

            async def body(n: int) -> dict[str, float]:
                nonlocal bad_replays
                sid = ids[n % len(ids)]
                t0 = time.perf_counter()
                await pause(http, sid)
                paused = time.perf_counter() - t0
                await asyncio.sleep(gap)  # a paused sandbox idles before it is resumed
                stamps.append(round(time.time(), 3))
                t0 = time.perf_counter()
                code = await connect(http, sid)
                resumed = time.perf_counter() - t0
                if code != 201 or not await replayed_once(store, envd, sid):
                    bad_replays += 1
                return {"pause": paused, "resume": resumed}

            series = await interleaved(cycles, body, raw, gap=gap)
    finally:
        await envd.close()
    return {
        "cycles": cycles,
        "gap_s": gap,
        "sandboxes": sandboxes,
        "processes_per_sandbox": len(COMMANDS),
        **{k: series.summary(k) for k in ("pause", "resume", "pod_start", "pod_serving")},
        "pod_stop": series.summary("pod_stop"),
        "ratio_resume_to_pod_start_p50": series.ratio_p("resume", "pod_start"),
        "ratio_resume_to_pod_start_p99": series.ratio_p("resume", "pod_start", 99),
        "ratio_resume_to_pod_serving_p50": series.ratio_p("resume", "pod_serving"),
        "ratio_resume_to_pod_serving_p99": series.ratio_p("resume", "pod_serving", 99),
        "bad_replays": bad_replays,
        "load_1m_during": series.load(),
        "samples_s": {
            **{k: v for k, v in series.samples_s().items() if k != "pod_stop"},
            "resume_started_at_unix": stamps,
        },
    }


async def run_local(cycles: int, sandboxes: int, gap: float = 0.0) -> dict[str, Any]:
    async with torpor_stack() as stack, raw_local(stack) as raw:
        return await measure(stack, raw, cycles, sandboxes, gap)


REAL_NODE = (
    "etcd + kube-apiserver + kube-controller-manager + kube-scheduler, REAL NODE: "
    "kubelet v1.36.3 + containerd 1.6 + runc + CNI bridge, sandbox-base image "
    "(tests/support/k8s/realnode.py)"
)


@contextlib.asynccontextmanager
async def real_node_rig(work: Path) -> AsyncIterator[Path]:
    """The real node: kubelet + containerd + runc, sandbox-base image
    (tests/support/k8s/realnode.py; needs root, scripts/build-k8s.sh and
    scripts/build-images.sh), with namespaces ``torpor-sandboxes`` and ``bench-raw``; yields
    its kubeconfig."""
    from tests.support.k8s.plugin import admin_client, create_namespace
    from tests.support.k8s.realnode import RealNode, ensure_images, ensure_node_binaries

    node = RealNode(
        bin_dir=ensure_node_binaries(build=False),
        workdir=work,
        images=ensure_images(build=True),
    )
    try:
        access = await asyncio.to_thread(node.start)
        kubeconfig = access.cluster.kubeconfig
        admin = await admin_client(kubeconfig)
        try:
            for ns in ("torpor-sandboxes", "bench-raw"):
                await create_namespace(admin, ns)
        finally:
            await admin.close()  # type: ignore[no-untyped-call]
        yield kubeconfig
    finally:
        await asyncio.to_thread(node.stop)


async def run_kubernetes(
    cycles: int, sandboxes: int, gap: float = 0.0, node: str = "test", persist: str = "layer"
) -> dict[str, Any]:
    """``persist``: the stack's ``sandbox-base`` (``layer``: as packaged, a claim per sandbox,
    which only the test kubelet's provisioner binds); the bare pod's is the same, except that
    with ``store`` it is ``none`` (an emptyDir: the runtime alone has no kept-files store)."""
    from shared.runtime.kubernetes import DEFAULT_TEMPLATES, PodTemplates

    work = Path(tempfile.mkdtemp(prefix=f"torpor-bench-k8s-{node}-"))
    try:
        env: dict[str, str] = {}
        raw_templates = None
        if persist != "layer":
            env["TORPOR_TEMPLATES_DIR"] = str(persist_templates(work / "templates", persist))
            raw_folder = persist_templates(work / "raw-templates", "none")
            raw_templates = PodTemplates(raw_folder, DEFAULT_TEMPLATES)
        rig = real_node_rig(work / "node") if node == "real" else kubernetes_rig(work)
        async with rig as kubeconfig:
            env |= {
                "TORPOR_KUBECONFIG": str(kubeconfig),
                "TORPOR_NAMESPACE": "torpor-sandboxes",
                "TORPOR_READY_TIMEOUT": "180" if node == "real" else "120",
            }
            async with (
                torpor_stack(runtime="kubernetes", env=env, root=work / "stack") as stack,
                raw_kubernetes(kubeconfig, "bench-raw", raw_templates) as raw,
            ):
                result = await measure(stack, raw, cycles, sandboxes, gap)
        plane = REAL_NODE if node == "real" else KUBERNETES_RIG
        reference = "an emptyDir" if persist != "layer" else "its claim"
        result["control_plane"] = (
            f"{plane}; template sandbox-base with persist: {persist}, the bare pod on {reference}"
        )
        result["persist"] = persist
        if node == "real":
            result["node"] = "real"
        return result
    finally:
        if not os.environ.get("TORPOR_BENCH_KEEP"):
            shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------- output


def report(runtime: str, result: dict[str, Any]) -> None:
    print(
        f"\n{runtime} runtime: {result['cycles']} cycles over {result['sandboxes']} sandboxes, "
        f"{result['processes_per_sandbox']} processes each; load {result['load_1m_during']}"
    )
    rows = [
        stats_row("pause (pause call → 204)", result["pause"]),
        stats_row("resume (connect → 201, replayed)", result["resume"]),
        stats_row("pod start → ready (runtime alone)", result["pod_start"]),
        stats_row("pod start → daemon serves List", result.get("pod_serving", {})),
    ]
    print(table(STATS_HEADERS, rows))
    print(
        f"resume ÷ pod start: p50 {result['ratio_resume_to_pod_start_p50']}, "
        f"p99 {result['ratio_resume_to_pod_start_p99']}; bad replays {result['bad_replays']}"
    )
    print(
        f"resume ÷ pod serving: p50 {result.get('ratio_resume_to_pod_serving_p50')}, "
        f"p99 {result.get('ratio_resume_to_pod_serving_p99')}"
    )


def chart() -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = {
        rt: json.loads(p.read_text())
        for rt in ("local", "kubernetes", "kubernetes_realnode")
        if (p := RESULTS / f"resume_{rt}.json").exists()
    }
    if not found:
        return None
    fig, axes = plt.subplots(1, len(found), figsize=(6.5 * len(found), 4.6), squeeze=False)
    for ax, (rt, doc) in zip(axes[0], found.items(), strict=True):
        samples = doc["samples_s"]
        for key, label, color in (
            ("pod_start", "pod start → ready (runtime alone)", "tab:gray"),
            ("pod_serving", "pod start → daemon serves List (runtime alone)", "tab:green"),
            ("resume", "resume: connect → processes replayed", "tab:blue"),
            ("pause", "pause: call → pod gone", "tab:orange"),
        ):
            if key not in samples:
                continue
            values = sorted(x * 1000 for x in samples[key])
            ys = [(i + 1) / len(values) for i in range(len(values))]
            p50 = doc[key]["p50_ms"]
            ax.step(values, ys, where="post", label=f"{label} (p50 {p50:.0f} ms)", color=color)
        title = f"{rt}: resume ÷ pod ready = {doc['ratio_resume_to_pod_start_p50']} (p50)"
        if "ratio_resume_to_pod_serving_p50" in doc:
            title += f", ÷ pod serving = {doc['ratio_resume_to_pod_serving_p50']}"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel("fraction of cycles")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        load = doc["load_1m_during"]
        ax.text(
            0.01,
            0.98,
            f"n={doc['cycles']}, 2 cores, load {load['min']}-{load['max']}",
            transform=ax.transAxes,
            fontsize=8,
            va="top",
        )
    fig.suptitle("torpor: resume latency against pod start latency (same machine, interleaved)")
    fig.tight_layout()
    fig.savefig(CHART, dpi=110)
    plt.close(fig)
    return CHART


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--runtime", choices=("local", "kubernetes", "both"), default="local")
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--sandboxes", type=int, default=4)
    parser.add_argument(
        "--gap",
        type=float,
        default=0.0,
        help="seconds of idle before each timed start (resume and bare pod alike)",
    )
    parser.add_argument(
        "--node",
        choices=("test", "real"),
        default="test",
        help="kubernetes only: the test kubelet (bubblewrap pods) or the real node "
        "(kubelet + containerd); real writes resume_kubernetes_realnode<suffix>.json",
    )
    parser.add_argument(
        "--persist",
        choices=("layer", "none", "store"),
        default=None,
        help="kubernetes only: the stack's sandbox-base torpor.dev/persist (default: layer, as "
        "packaged, on the test kubelet; none on the real node, which has no volume provisioner)",
    )
    parser.add_argument("--suffix", default="", help="result file suffix, e.g. _gap1")
    parser.add_argument("--chart-only", action="store_true")
    args = parser.parse_args()
    persist = args.persist or ("none" if args.node == "real" else "layer")
    if args.node == "real" and persist == "layer":
        parser.error("--node real: the real node has no volume provisioner; --persist none/store")
    if not args.chart_only:
        runtimes = ("local", "kubernetes") if args.runtime == "both" else (args.runtime,)
        for rt in runtimes:
            label = rt
            if rt == "local":
                run = run_local(args.cycles, args.sandboxes, args.gap)
            else:
                if args.node == "real":
                    label = "kubernetes_realnode"
                run = run_kubernetes(args.cycles, args.sandboxes, args.gap, args.node, persist)
            result = asyncio.run(run)
            report(rt, result)
            save_result(f"resume_{label}{args.suffix}", {"runtime": rt, **result})
    if (png := chart()) is not None:
        print(f"wrote {png}")


if __name__ == "__main__":
    main()
