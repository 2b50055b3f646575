"""The daemon's answer writing, before/after side by side: the daemon of this checkout and of
another (``--baseline``), each reached directly and through this checkout's proxy (the relay),
driven in turns by the same client with Connect ``process.Process/List`` (a unary answer: a head
and a body).

    .venv/bin/python bench/envd_answer_bench.py --baseline <checkout> [--client lean|httpx]
        [--requests 5000] [--rounds 4] [--concurrency 1] [--out NAME.json]

Prints rps, p50 and the CPU per request of the daemon and of the proxy (load-robust), medians
over the rounds, and writes bench/results/envd_answer_bench.json. Loopback only; bounded.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common import bench_parser, save_result  # noqa: E402

from bench.proxy_bench import SANDBOX, TOKEN, cpu_seconds, measure, wait_http  # noqa: E402

HOSTS = {"this": "127.0.7.43", "baseline": "127.0.7.44"}
RPC = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}


def main() -> int:
    parser = bench_parser(__doc__, out="envd_answer_bench.json")
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of main before")
    parser.add_argument("--client", choices=("lean", "httpx"), default="lean")
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    from shared.bus.server import free_port

    checkouts = {"this": REPO, "baseline": args.baseline.resolve()}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    sides: list[tuple[str, str, dict[str, str], str, str | None]] = []
    roots: list[str] = []
    try:
        for name, checkout in checkouts.items():
            host, port, proxy_port = HOSTS[name], free_port(HOSTS[name]), free_port()
            root = tempfile.mkdtemp(prefix="envd-answer-bench-")
            roots.append(root)
            command = ["-m", "services.envd", "--listen", f"{host}:{port}"]
            command += ["--access-token", TOKEN, "--root", root]
            procs[name] = subprocess.Popen([sys.executable, *command], cwd=checkout)
            serve = [str(REPO / "bench" / "proxy_bench.py"), "--serve-proxy", str(proxy_port), host]
            procs[f"proxy-{name}"] = subprocess.Popen([sys.executable, *serve], cwd=REPO)
            auth = {"X-Access-Token": TOKEN}
            route = {**auth, "E2b-Sandbox-Id": SANDBOX, "E2b-Sandbox-Port": str(port)}
            wait_http(f"http://{host}:{port}/health", auth, timeout=120)
            wait_http(f"http://127.0.0.1:{proxy_port}/health", route, timeout=120)
            sides.append((f"direct {name}", f"http://{host}:{port}", auth, name, None))
            sides.append(
                (f"relay {name}", f"http://127.0.0.1:{proxy_port}", route, name, f"proxy-{name}")
            )
        got: dict[str, list[dict[str, float]]] = {side[0]: [] for side in sides}
        per_request = 1e6 / (args.requests + 50)  # the warm-up requests count too
        loads = []
        for rnd in range(args.rounds):
            for label, url, headers, daemon, proxy in sides if rnd % 2 == 0 else sides[::-1]:
                pid = procs[proxy].pid if proxy else None
                before = cpu_seconds(procs[daemon].pid), cpu_seconds(pid) if pid else 0.0
                result = measure(
                    args.client,
                    url + "/process.Process/List",
                    {**headers, **RPC},
                    method="POST",
                    body=b"{}",
                    n=args.requests,
                    c=args.concurrency,
                )
                result["envd_cpu_us_per_req"] = (
                    cpu_seconds(procs[daemon].pid) - before[0]
                ) * per_request
                result["proxy_cpu_us_per_req"] = (
                    (cpu_seconds(pid) - before[1]) * per_request if pid else 0.0
                )
                got[label].append(result)
            loads.append(os.getloadavg()[0])
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            if proc.poll() is None:
                proc.kill()
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
    rows = []
    for label, results in got.items():
        row = {"side": label, "rounds": len(results)}
        for key in ("rps", "p50_ms", "envd_cpu_us_per_req", "proxy_cpu_us_per_req"):
            row[key] = statistics.median(r[key] for r in results)
        rows.append(row)
        print(
            f"{label:<16} rps {row['rps']:7.0f}  p50 {row['p50_ms']:.3f} ms  CPU us/req "
            f"envd {row['envd_cpu_us_per_req']:4.0f} proxy {row['proxy_cpu_us_per_req']:4.0f}",
            flush=True,
        )
    print(f"load per round: {[round(x, 1) for x in loads]}")
    save_result(
        args.out,
        {
            "client": args.client,
            "requests": args.requests,
            "concurrency": args.concurrency,
            "baseline": str(args.baseline),
            "load_1m_per_round": loads,
            "sides": rows,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
