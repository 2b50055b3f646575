"""envd latency: Start -> first (start) event, and List, against a local daemon subprocess.

Usage: .venv/bin/python bench/envd_bench.py [-n 200]
       .venv/bin/python bench/envd_bench.py --start [--starts 30]
       .venv/bin/python bench/envd_bench.py --throughput [--requests 3000] [--rounds 3]
            [--httpx-requests 2000] [--client-procs 1] [--clients lean,httpx]

``--throughput`` measures req/s of ``GET /health`` and Connect ``List`` at concurrency 1 and 32,
with two clients in the same loop: bench/loadgen.py (raw keep-alive sockets, near-free) in
``--client-procs`` processes of its own, and an httpx AsyncClient in the benchmark's process
(what bench/proxy_bench.py and the SDK use), plus the daemon's own CPU per request and the
client's. Each round measures c=1 and c=32 back to back (alternating which goes first); the
summary gives, per case and client, the median req/s and the c=32 / c=1 ratio with its spread
over the rounds. Writes bench/results/envd_throughput.json.

``--start`` times daemon start-up instead: process spawn -> first 204 on ``/health`` (and ->
first Connect ``List`` reply, which loads the lazily imported Connect services), over ``--starts``
starts, twice: "cold" (bytecode compiled from source, as a read-only tree without ``__pycache__``
gives it; forced with an empty ``PYTHONPYCACHEPREFIX``) and "precompiled" (after
``python -m services.envd --precompile``, which writes ``__pycache__`` next to the sources).
Writes bench/results/envd_start.json. Prints a table and writes bench/results/envd.json.
Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import structlog

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from shared.envd.client import ConnectEnvdClient  # noqa: E402
from shared.models.snapshots import ProcessConfig  # noqa: E402
from shared.ports.workloads import Endpoint  # noqa: E402

TOKEN = "bench-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_daemon(port: int, root: str) -> subprocess.Popen[bytes]:
    """envd on 127.0.0.1:``port`` serving ``root``, with the bench's access token."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.envd",
            "--listen",
            f"127.0.0.1:{port}",
            "--access-token",
            TOKEN,
            "--root",
            root,
        ],
        cwd=REPO,
    )


def write_result(name: str, out: dict[str, Any]) -> None:
    """``out`` with the machine and the time, as bench/results/``name``."""
    out["machine"] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
    }
    out["at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path = REPO / "bench" / "results" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path.relative_to(REPO)}")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(pct(ms, 0.99), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
        "max_ms": round(max(ms), 3),
    }


async def measure(port: int, n: int) -> dict[str, list[float]]:
    endpoint = Endpoint(host="127.0.0.1", port=port, pod_uid="bench")
    client = ConnectEnvdClient()
    start_lat: list[float] = []
    list_lat: list[float] = []
    pids: list[int] = []
    try:
        config = ProcessConfig(cmd="/bin/sleep", args=["300"])
        for _ in range(n):
            t0 = time.perf_counter()
            pids.append(await client.start_process(endpoint, config, tag=None, access_token=TOKEN))
            start_lat.append(time.perf_counter() - t0)
            # Keep the table small and realistic: a sandbox runs a handful of processes.
            if len(pids) > 5:
                os.kill(pids.pop(0), 9)
        for _ in range(n):
            t0 = time.perf_counter()
            await client.list_processes(endpoint, access_token=TOKEN)
            list_lat.append(time.perf_counter() - t0)
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        await client.close()
    return {"start_first_event": start_lat, "list": list_lat}


def _start_once(env: dict[str, str]) -> tuple[float, float]:
    """Seconds from spawn to the first /health answer and to the first List answer."""
    port = free_port()
    root = tempfile.mkdtemp(prefix="envd-start-")
    health = b"GET /health HTTP/1.1\r\nHost: envd\r\n\r\n"
    rpc = (
        b"POST /process.Process/List HTTP/1.1\r\nHost: envd\r\nContent-Type: application/json\r\n"
        b"Content-Length: 2\r\n\r\n{}"
    )
    t0 = time.perf_counter()
    daemon = subprocess.Popen(
        [sys.executable, "-m", "services.envd", "--listen", f"127.0.0.1:{port}", "--root", root],
        cwd=REPO,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # the daemon binds first thing, then the client waits in the backlog
            sock = socket.socket()
            try:
                sock.connect(("127.0.0.1", port))
                break
            except OSError:
                sock.close()
                if time.monotonic() > deadline or daemon.poll() is not None:
                    raise RuntimeError("envd did not start") from None
                time.sleep(0.002)
        with sock:
            sock.settimeout(60)
            sock.sendall(health)
            if b" 204 " not in sock.recv(4096):
                raise RuntimeError("/health did not answer 204")
            to_health = time.perf_counter() - t0
            sock.sendall(rpc)
            if b" 200 " not in sock.recv(65536):
                raise RuntimeError("List did not answer 200")
            to_rpc = time.perf_counter() - t0
    finally:
        daemon.terminate()
        daemon.wait(10)
    return to_health, to_rpc


def start_bench(starts: int) -> int:
    subprocess.run([sys.executable, "-m", "services.envd", "--precompile"], cwd=REPO, check=True)
    empty_cache = tempfile.mkdtemp(prefix="envd-nopyc-")
    envs = {
        "cold": {**os.environ, "PYTHONPYCACHEPREFIX": empty_cache, "PYTHONDONTWRITEBYTECODE": "1"},
        "precompiled": {**os.environ},
    }
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in envs}
    for _ in range(starts):  # interleaved, so load changes hit both alike
        for name, env in envs.items():
            samples[name].append(_start_once(env))
    rows = {}
    print(f"envd start-up, {starts} starts each, loadavg {os.getloadavg()[0]:.1f}")
    print(f"{'bytecode':<12}{'->/health p50':>15}{'p99':>8}{'->List p50':>12}{'p99':>8}  (ms)")
    for name, pairs in samples.items():
        health, rpc = summary([h for h, _ in pairs]), summary([r for _, r in pairs])
        rows[name] = {"to_health": health, "to_first_list": rpc}
        print(
            f"{name:<12}{health['p50_ms']:>15.0f}{health['p99_ms']:>8.0f}"
            f"{rpc['p50_ms']:>12.0f}{rpc['p99_ms']:>8.0f}"
        )
    out = {
        "benchmark": "envd_start",
        "starts": starts,
        "results": rows,
    }
    write_result("envd_start.json", out)
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def httpx_drive(
    url: str, headers: dict[str, str], body: bytes | None, n: int, concurrency: int
) -> float:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    method = "POST" if body is not None else "GET"
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        todo = iter(range(n))

        async def worker() -> None:
            for _ in todo:
                r = await client.request(method, url, headers=headers, content=body)
                if r.status_code >= 300:
                    raise RuntimeError(f"HTTP {r.status_code}")

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return n / (time.perf_counter() - started)


def _own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def throughput(
    requests: int, httpx_requests: int, rounds: int, procs: int, clients: list[str]
) -> int:
    from bench.loadgen import drive_in_processes

    port = free_port()
    root = tempfile.mkdtemp(prefix="envd-bench-")
    daemon = start_daemon(port, root)
    base = f"http://127.0.0.1:{port}"
    auth = {"x-access-token": TOKEN}
    rpc = {**auth, "content-type": "application/json", "connect-protocol-version": "1"}
    cases = [
        ("GET /health", "/health", auth, None),
        ("Connect List", "/process.Process/List", rpc, b"{}"),
    ]
    rows: list[dict[str, Any]] = []
    try:
        for _ in range(600):
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{base}/health", timeout=10).status_code == 204:
                    break
            time.sleep(0.05)
        print(
            f"envd throughput: {rounds} rounds; lean client: {requests} requests per cell in "
            f"{procs} process(es) of its own; httpx: {httpx_requests} per cell in this process; "
            f"load {os.getloadavg()[0]:.1f}"
        )
        print(
            f"{'case':<14}{'client':>8}{'conc':>6}{'req/s':>9}{'p50 ms':>9}"
            f"{'envd us/req':>13}{'client us/req':>15}  load"
        )
        for rnd in range(rounds):
            for name, path, headers, body in cases:
                for client in clients:
                    # interleaved, alternating which goes first: the same load for both
                    for conc in (1, 32) if rnd % 2 == 0 else (32, 1):
                        cpu = cpu_seconds(daemon.pid)
                        if client == "lean":
                            r = drive_in_processes(
                                base + path,
                                method="POST" if body is not None else "GET",
                                headers=headers,
                                body=body or b"",
                                n=requests,
                                concurrency=conc,
                                processes=procs,
                            )
                            rps, p50, client_us = r.rps, r.p50_ms, r.client_cpu_us_per_req
                        else:
                            own = _own_cpu_seconds()
                            rps = asyncio.run(
                                httpx_drive(base + path, headers, body, httpx_requests, conc)
                            )
                            p50 = None
                            client_us = (_own_cpu_seconds() - own) * 1e6 / httpx_requests
                        n = requests + 50 if client == "lean" else httpx_requests  # + warm-up
                        used = (cpu_seconds(daemon.pid) - cpu) * 1e6 / n
                        row = {
                            "round": rnd,
                            "case": name,
                            "client": client,
                            "concurrency": conc,
                            "rps": round(rps, 1),
                            "p50_ms": None if p50 is None else round(p50, 3),
                            "envd_cpu_us_per_req": round(used, 1),
                            "client_cpu_us_per_req": round(client_us, 1),
                            "load_1m": os.getloadavg()[0],
                        }
                        rows.append(row)
                        print(
                            f"{name:<14}{client:>8}{conc:>6}{rps:>9.0f}"
                            f"{'' if p50 is None else f'{p50:.2f}':>9}{used:>13.0f}"
                            f"{client_us:>15.0f}  {row['load_1m']:.1f}",
                            flush=True,
                        )
    finally:
        daemon.terminate()
        daemon.wait(10)
        shutil.rmtree(root, ignore_errors=True)
    summary_rows = _summarise(rows, cases=[c[0] for c in cases], clients=clients)
    path_out = REPO / "bench" / "results" / "envd_throughput.json"
    path_out.write_text(
        json.dumps(
            {
                "benchmark": "envd_throughput",
                "requests": requests,
                "httpx_requests": httpx_requests,
                "rounds": rounds,
                "client_processes": procs,
                "summary": summary_rows,
                "rows": rows,
                "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {path_out.relative_to(REPO)}")
    return 0


def _summarise(
    rows: list[dict[str, Any]], *, cases: list[str], clients: list[str]
) -> list[dict[str, Any]]:
    """Per case and client: req/s at 1 and 32 (median of the rounds), their ratio per round
    (each pair measured back to back) with its spread, and the daemon's CPU per request."""
    out = []
    print(
        f"\n{'case':<14}{'client':>8}{'req/s c=1':>11}{'c=32':>8}{'32/1':>7}{'(min-max)':>12}"
        f"{'envd us/req 1 / 32':>20}{'client us/req 1 / 32':>22}"
        f"{'envd capacity 1 / 32':>22}  load"
    )
    for case in cases:
        for client in clients:
            cell = [r for r in rows if r["case"] == case and r["client"] == client]
            one = [r for r in cell if r["concurrency"] == 1]
            many = [r for r in cell if r["concurrency"] == 32]
            ratios = [b["rps"] / a["rps"] for a, b in zip(one, many, strict=True)]

            def med(items: list[dict[str, Any]], key: str) -> float:
                return float(statistics.median(r[key] for r in items))

            row = {
                "case": case,
                "client": client,
                "rps_c1": med(one, "rps"),
                "rps_c32": med(many, "rps"),
                "ratio_c32_c1": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "envd_cpu_us_per_req_c1": med(one, "envd_cpu_us_per_req"),
                "envd_cpu_us_per_req_c32": med(many, "envd_cpu_us_per_req"),
                "client_cpu_us_per_req_c1": med(one, "client_cpu_us_per_req"),
                "client_cpu_us_per_req_c32": med(many, "client_cpu_us_per_req"),
                # req/s one core would serve at that CPU per request: what the daemon can do,
                # whatever share of the cores the machine's load leaves it
                "envd_capacity_c1": 1e6 / max(med(one, "envd_cpu_us_per_req"), 1.0),
                "envd_capacity_c32": 1e6 / max(med(many, "envd_cpu_us_per_req"), 1.0),
                "load_1m": [min(r["load_1m"] for r in cell), max(r["load_1m"] for r in cell)],
            }
            out.append(row)
            spread = f"({row['ratio_min']:.2f}-{row['ratio_max']:.2f})"
            print(
                f"{case:<14}{client:>8}{row['rps_c1']:>11.0f}{row['rps_c32']:>8.0f}"
                f"{row['ratio_c32_c1']:>7.2f}{spread:>12}"
                f"{row['envd_cpu_us_per_req_c1']:>11.0f} / {row['envd_cpu_us_per_req_c32']:<6.0f}"
                f"{row['client_cpu_us_per_req_c1']:>13.0f} / "
                f"{row['client_cpu_us_per_req_c32']:<6.0f}"
                f"{row['envd_capacity_c1']:>13.0f} / {row['envd_capacity_c32']:<7.0f}"
                f"  {row['load_1m'][0]:.1f}-{row['load_1m'][1]:.1f}"
            )
    return out


def main() -> int:
    import logging

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=200)
    parser.add_argument("--start", action="store_true", help="time daemon start-up instead")
    parser.add_argument("--starts", type=int, default=30)
    parser.add_argument("--throughput", action="store_true", help="req/s at concurrency 1 and 32")
    parser.add_argument("--requests", type=int, default=3000, help="per cell (lean client)")
    parser.add_argument(
        "--httpx-requests", type=int, default=2000, help="per cell, httpx client (--throughput)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--client-procs",
        type=int,
        default=1,
        help="processes the lean client runs in (its own, apart from the benchmark's)",
    )
    parser.add_argument(
        "--clients", default="lean,httpx", help="comma-separated: lean and/or httpx"
    )
    args = parser.parse_args()
    if args.start:
        return start_bench(args.starts)
    if args.throughput:
        clients = [c for c in args.clients.split(",") if c]
        if not clients or any(c not in ("lean", "httpx") for c in clients):
            parser.error("--clients: lean and/or httpx")
        return throughput(
            args.requests, args.httpx_requests, args.rounds, args.client_procs, clients
        )
    port = free_port()
    root = tempfile.mkdtemp(prefix="envd-bench-")
    t0 = time.perf_counter()
    daemon = start_daemon(port, root)
    try:
        ready = None
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 204:
                    ready = time.perf_counter() - t0
                    break
            except httpx.TransportError:
                time.sleep(0.01)
        if ready is None:
            print("envd did not become healthy", file=sys.stderr)
            return 1
        results = asyncio.run(measure(port, args.n))
    finally:
        daemon.terminate()
        daemon.wait(10)
        shutil.rmtree(root, ignore_errors=True)
    rows = {name: summary(values) for name, values in results.items()}
    print(f"envd bench: n={args.n}, daemon ready after {ready * 1000:.0f} ms")
    print(f"{'operation':<20}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}{'max ms':>10}")
    for name, row in rows.items():
        print(
            f"{name:<20}{row['p50_ms']:>10.2f}{row['p99_ms']:>10.2f}"
            f"{row['mean_ms']:>10.2f}{row['max_ms']:>10.2f}"
        )
    out = {
        "benchmark": "envd",
        "n": args.n,
        "startup_to_health_ms": round(ready * 1000, 1),
        "results": rows,
    }
    write_result("envd.json", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
