"""Shared helpers of the benchmarks: statistics, result files, and a whole torpor stack on free
loopback ports in a temporary directory.

``torpor_stack`` is the tests' ``Stack`` (tests/support/stack.py): a private nats-server, an API
key for the user ``bench``, then every service as its own process (``python -m services.cli run
<name>``, exactly what ``torpor up`` supervises) with ``replicas`` copies of each. On the local
runtime the pods are bubblewrap process trees; with ``runtime="kubernetes"`` the services talk to
the kube-apiserver whose kubeconfig is given (the test rig of ``tests/k8s``). Everything listens
on and dials 127.0.0.0/8 only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from shared.logging import configure  # noqa: E402
from shared.settings import LoggingSettings  # noqa: E402
from tests.support.stack import Stack  # noqa: E402

if TYPE_CHECKING:
    from shared.envd.client import ConnectEnvdClient

# The benchmark's own runtime and envd clients log at warning: the figures are the output.
configure(LoggingSettings(log_level="warning"), service="bench")

RESULTS = REPO / "bench" / "results"
USER = "bench"

# ---------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100): p99 of 100 samples is the 99th smallest."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def summary(seconds: Sequence[float]) -> dict[str, float]:
    """Milliseconds: n, p50, p90, p99, min, max, mean."""
    if not seconds:
        return {"n": 0}
    return {
        "n": len(seconds),
        "p50_ms": round(percentile(seconds, 50) * 1000, 1),
        "p90_ms": round(percentile(seconds, 90) * 1000, 1),
        "p99_ms": round(percentile(seconds, 99) * 1000, 1),
        "min_ms": round(min(seconds) * 1000, 1),
        "max_ms": round(max(seconds) * 1000, 1),
        "mean_ms": round(statistics.fmean(seconds) * 1000, 1),
    }


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("nan")


# ---------------------------------------------------------------- machine and results


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict[str, Any]:
    mem_kib = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    return {
        "cpus": os.cpu_count(),
        "mem_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "loadavg": loadavg(),
    }


def write_result(name: str, data: dict[str, Any]) -> Path:
    """``bench/results/<name>.json`` with the machine, its load and the time added."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    doc = {
        "benchmark": name,
        **data,
        "machine": machine(),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def bench_parser(doc: str | None, *, out: str | None = None) -> argparse.ArgumentParser:
    """A benchmark's command line, its module docstring the help (its usage lines as written);
    with ``out``, ``--out NAME``: the name of its result file in bench/results/."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    if out is not None:
        parser.add_argument(
            "--out", default=out, help="result file name in bench/results/ (default %(default)s)"
        )
    return parser


def save_result(name: str, data: dict[str, Any]) -> Path:
    """``write_result`` under ``name`` (a file name: a folder part and ``.json`` are dropped),
    and say where."""
    path = write_result(Path(name).name.removesuffix(".json"), data)
    print(f"wrote {path.relative_to(REPO)}")
    return path


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *([_cell(c) for c in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3f}".rstrip("0").rstrip(".")
    return str(value)


def stats_row(label: str, stats: dict[str, float]) -> list[object]:
    return [
        label,
        stats.get("n", 0),
        stats.get("p50_ms", ""),
        stats.get("p90_ms", ""),
        stats.get("p99_ms", ""),
        stats.get("max_ms", ""),
    ]


STATS_HEADERS = ("measurement", "n", "p50 ms", "p90 ms", "p99 ms", "max ms")


# ---------------------------------------------------------------- a whole stack


@contextlib.asynccontextmanager
async def torpor_stack(
    *,
    replicas: int = 1,
    runtime: str = "local",
    env: dict[str, str] | None = None,
    log_level: str | None = None,
    root: Path | None = None,
    services: tuple[str, ...] | None = None,
) -> AsyncIterator[Stack]:
    """The tests' ``Stack`` with one user, ``USER``, in ``root`` or a temporary directory
    (removed afterwards unless ``TORPOR_BENCH_KEEP=1``, for a post-mortem of the logs).
    ``TORPOR_BENCH_LOG_LEVEL=info`` to look into a slow cycle (``TORPOR_BENCH_LOG_FORMAT=json``
    for ``bench/claim_breakdown.py``); ``TORPOR_BENCH_READY_TIMEOUT``
    (seconds) for services that import slowly on a heavily loaded machine."""
    owns_root = root is None
    root = root or Path(tempfile.mkdtemp(prefix="torpor-bench-"))
    try:
        async with Stack(
            root,
            replicas=replicas,
            runtime=runtime,
            **({"services": services} if services is not None else {}),
            users={USER: False},
            env=env or {},
            log_level=log_level or os.environ.get("TORPOR_BENCH_LOG_LEVEL", "warning"),
            # json: for bench/claim_breakdown.py
            log_format=os.environ.get("TORPOR_BENCH_LOG_FORMAT", "console"),
            ready_timeout=float(os.environ.get("TORPOR_BENCH_READY_TIMEOUT", "180")),
        ) as stack:
            yield stack
    finally:
        if owns_root:
            if os.environ.get("TORPOR_BENCH_KEEP"):
                print(f"kept {root}", file=sys.stderr)
            else:
                shutil.rmtree(root, ignore_errors=True)


def sdk_opts(stack: Stack) -> dict[str, str]:
    """The E2B SDK's connection options (``Sandbox.create(**opts)``) as ``USER`` of ``stack``."""
    return {"api_key": stack.keys[USER], "api_url": stack.api_url, "sandbox_url": stack.proxy_url}


# ---------------------------------------------------------------- E2B REST calls


async def start_commands(envd: ConnectEnvdClient, rec: Any, commands: Iterable[str]) -> None:
    """Each command as a login shell's process in /workspace of the sandbox ``rec`` (its
    record: host, pod, envd token), so that a pause has processes to keep."""
    from shared.models.snapshots import ProcessConfig
    from shared.ports.workloads import Endpoint

    for command in commands:
        await envd.start_process(
            Endpoint(host=rec.host, pod_uid=rec.pod_uid),
            ProcessConfig(cmd="/bin/bash", args=["-l", "-c", command], cwd="/workspace"),
            tag=None,
            access_token=rec.envd_access_token,
        )


async def create_sandbox(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    r = await http.post("/sandboxes", json={"templateID": "sandbox-base", "timeout": 3600, **body})
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]


async def pause(http: httpx.AsyncClient, sandbox_id: str) -> None:
    r = await http.post(f"/sandboxes/{sandbox_id}/pause")
    if r.status_code != 204:
        msg = f"pause {sandbox_id}: {r.status_code} {r.text[:300]}"
        raise RuntimeError(msg)


async def connect(http: httpx.AsyncClient, sandbox_id: str, *, timeout: int = 3600) -> int:
    r = await http.post(f"/sandboxes/{sandbox_id}/connect", json={"timeout": timeout})
    if r.status_code not in (200, 201):
        msg = f"connect {sandbox_id}: {r.status_code} {r.text[:300]}"
        raise RuntimeError(msg)
    return r.status_code


async def kill(http: httpx.AsyncClient, sandbox_id: str) -> None:
    r = await http.delete(f"/sandboxes/{sandbox_id}")
    if r.status_code not in (204, 404):
        msg = f"kill {sandbox_id}: {r.status_code} {r.text[:300]}"
        raise RuntimeError(msg)
