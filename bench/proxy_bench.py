"""Proxy benchmark: overhead against direct daemon access, and first-request latency on a paused
sandbox (auto-resume).

    .venv/bin/python bench/proxy_bench.py [--requests 2000] [--concurrency 32] [--no-resume]
        [--rounds 3] [--client httpx|lean] [--baseline <checkout of another commit>]
        [--pump haproxy|socat|haproxy-http|none] [--client-cpu N] [--out NAME.json]

Part 1 runs the real in-sandbox daemon (``python -m services.envd``) on its own loopback
address and the proxy (``ProxyApp``, the production ASGI app under uvicorn) in a separate
process with a static record, then drives both with the same client: ``GET /health`` and the
Connect unary ``process.Process/List``. Part 2 starts the whole system (tests/support/stack.py:
nats + api + proxy + scheduler + snapshotter + scaler, local runtime), pauses a sandbox running
``python3 -m http.server`` and times the first request through the proxy. Prints a table and
writes bench/results/proxy_bench.json. Loopback only; every loop is bounded.

``--pump`` adds a reference side: a TCP byte pump written in C (haproxy in ``mode tcp`` or socat;
no HTTP parsing, no auth, no routing) between the same client and the same daemon, measured in
the same rounds. It is the physical limit of one proxy hop on this machine: what any proxy
costs before it does anything of its own. ``--pump haproxy-http`` is the L7 reference instead:
haproxy in ``mode http`` parsing every request, routing on the sandbox header, checking the
access token, dropping torpor's headers and adding X-Forwarded-For, as the relay does, in C.
Benchmark references only, never a product dependency: when the binary is missing the
benchmark says so and measures without it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

POD_HOST = "127.0.7.41"
TOKEN = "bench-token"
SANDBOX = "bench-sbx"


# ------------------------------------------------------------------ proxy process (static record)


def serve_proxy(port: int, pod_host: str) -> None:
    import uvicorn

    from services.proxy.app import ProxyApp, ProxyWiring
    from services.proxy.settings import ProxySettings
    from shared.domain.record import SandboxRecord
    from shared.domain.states import SandboxState
    from shared.logging import configure
    from shared.ports.lifecycle import ResumeResult
    from shared.settings import LoggingSettings
    from shared.web.limits import HttpLimits
    from shared.web.serving import server_config

    now = datetime.now(UTC)
    record = SandboxRecord(
        sandbox_id=SANDBOX,
        owner="bench",
        state=SandboxState.RUNNING,
        host=pod_host,
        envd_access_token=TOKEN,
        created_at=now,
        started_at=now,
        updated_at=now,
    )

    class Static:
        async def get(self, sandbox_id: str) -> SandboxRecord | None:
            return record if sandbox_id == SANDBOX else None

        def peek(self, sandbox_id: str) -> SandboxRecord | None:
            return record if sandbox_id == SANDBOX else None

        def remember(self, record: SandboxRecord) -> None:
            pass

        async def resume(
            self, sandbox_id: str, *, owner: str | None, wait: float = 55.0
        ) -> ResumeResult:
            return ResumeResult(record=record, resumed=False)

        async def touch(self, sandbox_id: str, *, seen_at: datetime | None = None) -> None:
            pass

    configure(LoggingSettings(log_level="warning"), service="proxy")  # as in production
    static = Static()
    limits = HttpLimits()
    app = ProxyApp(
        ProxySettings(),
        wiring=ProxyWiring(records=static, lifecycle=static, keys=None),
        limits=limits,
    )
    # The production server: the guarded protocol and the limits (shared/web), as in main.py.
    config = server_config(
        app, limits, host="127.0.0.1", port=port, timeout_keep_alive=75, backlog=4096
    )  # as services/proxy/main.py (uvicorn's default 5 s keep-alive races a loaded client)
    uvicorn.Server(config).run()


# ------------------------------------------------------------------ load generation


async def drive(
    url: str, headers: dict[str, str], *, method: str, body: bytes | None, n: int, concurrency: int
) -> dict[str, float]:
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        for _ in range(50):  # warm up connections
            await client.request(method, url, headers=headers, content=body)
        queue = iter(range(n))

        async def worker() -> None:
            for _ in queue:
                t = time.perf_counter()
                r = await client.request(method, url, headers=headers, content=body)
                latencies.append(time.perf_counter() - t)
                if r.status_code >= 300:
                    raise RuntimeError(f"{url}: HTTP {r.status_code} {r.text[:200]}")

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
        "rps": n / elapsed,
    }


def wait_http(url: str, headers: dict[str, str] | None = None, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, headers=headers, timeout=1).status_code < 300:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, its reaped and its live children so far (load-independent,
    unlike latency on a busy box; socat forks one child per connection)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0  # a socat child gone with its connection
    own = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime..cstime
    return own + sum(cpu_seconds(int(c)) for c in children)


PUMPS = ("haproxy", "socat", "haproxy-http")
# The L7 reference parses every request as the relay does: routes on the sandbox header, checks
# the access token, drops torpor's headers, adds X-Forwarded-For, reuses upstream connections.
_L7 = "haproxy-http"


def pump_command(pump: str, port: int, upstream: str, tmp: Path) -> list[str] | None:
    """The reference L4 pump's command line, or None when its binary is not installed."""
    name = "haproxy" if pump == _L7 else pump
    binary = shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if binary is None:
        return None
    host, upstream_port = upstream.rsplit(":", 1)
    if pump == "socat":  # one forked process per connection, blocking read/write
        return [
            binary,
            f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,nodelay,backlog=4096",
            f"TCP:{host}:{upstream_port},nodelay",
        ]
    config = tmp / "haproxy.cfg"
    if pump == _L7:  # one thread, HTTP mode: what the relay does, written in C
        config.write_text(
            "global\n  nbthread 1\n  maxconn 4096\n"
            "defaults\n  mode http\n  option http-keep-alive\n  option forwardfor\n"
            "  timeout connect 5s\n  timeout client 300s\n  timeout server 300s\n"
            "  timeout http-keep-alive 75s\n"
            f"frontend relay\n  bind 127.0.0.1:{port}\n"
            f"  http-request deny unless {{ req.hdr(e2b-sandbox-id) -m str {SANDBOX} }} "
            f"{{ req.hdr(x-access-token) -m str {TOKEN} }}\n"
            "  http-request del-header e2b-sandbox-id\n"
            "  http-request del-header e2b-sandbox-port\n"
            "  default_backend sandbox\n"
            "backend sandbox\n  http-reuse always\n"
            f"  server envd {host}:{upstream_port}\n"
        )
        return [binary, "-db", "-f", str(config)]
    # one thread, epoll, TCP mode: no HTTP parsing at all
    config.write_text(
        "global\n  nbthread 1\n  maxconn 4096\n"
        "defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 300s\n"
        "  timeout server 300s\n"
        f"listen pump\n  bind 127.0.0.1:{port}\n  server envd {host}:{upstream_port}\n"
    )
    return [binary, "-db", "-f", str(config)]


def measure(
    client: str,
    url: str,
    headers: dict[str, str],
    *,
    method: str,
    body: bytes | None,
    n: int,
    c: int,
) -> dict[str, float]:
    if client == "lean":
        from bench.loadgen import drive as lean_drive

        result = lean_drive(
            url, method=method, headers=headers, body=body or b"", n=n, concurrency=c
        )
        return result.as_dict()
    return asyncio.run(drive(url, headers, method=method, body=body, n=n, concurrency=c))


def _ratios(side: list[dict[str, float]], direct: list[dict[str, float]]) -> list[float]:
    return [s["rps"] / d["rps"] for s, d in zip(side, direct, strict=True)]


def _median(results: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in results)


def _side(side: str, got: dict[str, list[dict[str, float]]]) -> dict[str, float]:
    """``<side>_p50_ms``, ``<side>_p99_ms``, ``<side>_rps``: the side's medians over the rounds."""
    return {f"{side}_{key}": _median(got[side], key) for key in ("p50_ms", "p99_ms", "rps")}


def _spread(name: str, ratios: list[float]) -> dict[str, float]:
    """``name`` (the median of the rounds' ratios), ``name_min``, ``name_max``."""
    return {name: statistics.median(ratios), f"{name}_min": min(ratios), f"{name}_max": max(ratios)}


def _print_header() -> None:
    print(
        f"{'case':<14} {'conc':>4} {'direct p50':>10} {'p99':>8} {'rps':>7} | "
        f"{'proxy p50':>9} {'p99':>8} {'rps':>7} | {'ratio':>5} {'(min-max)':>11} | "
        "CPU us/req: envd, proxy | load",
        flush=True,
    )


def _print_row(r: dict[str, Any]) -> None:
    print(
        f"{r['case']:<14} {r['concurrency']:>4} "
        f"{r['direct_p50_ms']:>8.2f}ms {r['direct_p99_ms']:>6.2f}ms "
        f"{r['direct_rps']:>7.0f} | {r['proxy_p50_ms']:>7.2f}ms {r['proxy_p99_ms']:>6.2f}ms "
        f"{r['proxy_rps']:>7.0f} | {r['throughput_ratio']:>5.2f} "
        f"({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) | "
        f"{r['envd_cpu_us_per_req_direct']:>5.0f} {r['proxy_cpu_us_per_req']:>6.0f} "
        f"| {r['load_1m']:.1f}",
        flush=True,
    )
    if "baseline_rps" in r:
        print(
            f"{'  baseline':<19} {r['baseline_p50_ms']:>7.2f}ms {r['baseline_p99_ms']:>6.2f}ms "
            f"{r['baseline_rps']:>7.0f} | ratio {r['baseline_ratio']:>5.2f} "
            f"({r['baseline_ratio_min']:.2f}-{r['baseline_ratio_max']:.2f}) | "
            f"CPU us/req {r['baseline_cpu_us_per_req']:.0f}",
            flush=True,
        )
    if "pump_rps" in r:
        print(
            f"{'  pump ' + r['pump']:<19} {r['pump_p50_ms']:>7.2f}ms {r['pump_p99_ms']:>6.2f}ms "
            f"{r['pump_rps']:>7.0f} | ratio {r['pump_ratio']:>5.2f} "
            f"({r['pump_ratio_min']:.2f}-{r['pump_ratio_max']:.2f}) | "
            f"CPU us/req {r['pump_cpu_us_per_req']:.0f} | relay/pump {r['proxy_over_pump']:.2f} "
            f"({r['proxy_over_pump_min']:.2f}-{r['proxy_over_pump_max']:.2f})",
            flush=True,
        )


def overhead(
    n: int,
    concurrency: int,
    *,
    client: str = "httpx",
    baseline: Path | None = None,
    rounds: int = 3,
    pump: str = "none",
    client_cpu: int | None = None,
) -> list[dict[str, object]]:
    from shared.bus.server import free_port

    envd_port = free_port(POD_HOST)
    proxy_port = free_port()
    base_port = free_port()
    pump_port = free_port()
    pump_dir = Path(tempfile.mkdtemp(prefix="proxy-bench-pump-"))
    envd_root = Path(tempfile.mkdtemp(prefix="envd-bench-"))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "services.envd",
                "--listen",
                f"{POD_HOST}:{envd_port}",
                "--access-token",
                TOKEN,
                "--root",
                str(envd_root),
            ],
            cwd=REPO,
        ),
        subprocess.Popen(
            [sys.executable, __file__, "--serve-proxy", str(proxy_port), POD_HOST], cwd=REPO
        ),
    ]
    if baseline is not None:  # the same proxy from another checkout, measured in the same loop
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(baseline / "bench" / "proxy_bench.py"),
                    "--serve-proxy",
                    str(base_port),
                    POD_HOST,
                ],
                cwd=baseline,
            )
        )
    pump_index = None
    if pump != "none":
        command = pump_command(pump, pump_port, f"{POD_HOST}:{envd_port}", pump_dir)
        if command is None:
            print(
                f"reference pump {pump!r} is not installed (apt-get install {pump}): "
                "measuring without it",
                flush=True,
            )
        else:
            pump_index = len(procs)
            procs.append(subprocess.Popen(command, stdout=subprocess.DEVNULL))
    rows: list[dict[str, object]] = []
    affinity = os.sched_getaffinity(0)
    if client_cpu is not None:  # after the servers started: they keep every CPU
        os.sched_setaffinity(0, {client_cpu})
    try:
        direct = f"http://{POD_HOST}:{envd_port}"
        proxied = f"http://127.0.0.1:{proxy_port}"
        auth = {"X-Access-Token": TOKEN}
        route = {**auth, "E2b-Sandbox-Id": SANDBOX, "E2b-Sandbox-Port": str(envd_port)}
        based = f"http://127.0.0.1:{base_port}"
        wait_http(f"{direct}/health", auth, timeout=120)
        wait_http(f"{proxied}/health", route, timeout=120)
        if baseline is not None:
            wait_http(f"{based}/health", route, timeout=120)
        pumped = f"http://127.0.0.1:{pump_port}"
        if pump_index is not None:
            wait_http(f"{pumped}/health", route if pump == _L7 else auth, timeout=30)
        rpc = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
        cases = [
            ("GET /health", "GET", "/health", None, {}),
            ("Connect List", "POST", "/process.Process/List", b"{}", rpc),
        ]
        sides = {"direct": (direct, {**auth}, 0), "proxy": (proxied, route, 1)}
        if baseline is not None:
            sides["baseline"] = (based, route, 2)
        if pump_index is not None:  # L4: the daemon's own headers, nothing to route on
            sides["pump"] = (pumped, route if pump == _L7 else {**auth}, pump_index)
        per_request = 1e6 / (n + 50)  # the warm-up requests count too
        for name, method, path, body, extra in cases:
            for conc in (1, concurrency):
                got: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
                cpu: dict[str, float] = dict.fromkeys(sides, 0.0)
                envd_cpu: dict[str, float] = dict.fromkeys(sides, 0.0)
                loads: list[float] = []
                for rnd in range(rounds):
                    # the sides take turns going first: a load swing hits each alike
                    order = list(sides) if rnd % 2 == 0 else list(reversed(sides))
                    for side in order:
                        url, headers, index = sides[side]
                        before = cpu_seconds(procs[index].pid), cpu_seconds(procs[0].pid)
                        got[side].append(
                            measure(
                                client,
                                url + path,
                                {**headers, **extra},
                                method=method,
                                body=body,
                                n=n,
                                c=conc,
                            )
                        )
                        cpu[side] += cpu_seconds(procs[index].pid) - before[0]
                        envd_cpu[side] += cpu_seconds(procs[0].pid) - before[1]
                    loads.append(os.getloadavg()[0])
                ratios = _ratios(got["proxy"], got["direct"])
                row: dict[str, object] = {
                    "case": name,
                    "concurrency": conc,
                    "rounds": rounds,
                    **_side("direct", got),
                    **_side("proxy", got),
                    # per round, each the two sides measured back to back; the median is the
                    # figure, min-max the spread
                    "throughput_ratio": statistics.median(ratios),
                    "ratio_per_round": [round(r, 3) for r in ratios],
                    "ratio_min": min(ratios),
                    "ratio_max": max(ratios),
                    "envd_cpu_us_per_req_direct": envd_cpu["direct"] * per_request / rounds,
                    "envd_cpu_us_per_req_proxied": envd_cpu["proxy"] * per_request / rounds,
                    "proxy_cpu_us_per_req": cpu["proxy"] * per_request / rounds,
                    "load_1m": statistics.median(loads),
                    "load_1m_per_round": loads,
                }
                if baseline is not None:
                    base_ratios = _ratios(got["baseline"], got["direct"])
                    row.update(
                        **_side("baseline", got),
                        **_spread("baseline_ratio", base_ratios),
                        baseline_cpu_us_per_req=cpu["baseline"] * per_request / rounds,
                    )
                if pump_index is not None:
                    pump_ratios = _ratios(got["pump"], got["direct"])
                    over_pump = _ratios(got["proxy"], got["pump"])
                    row.update(
                        pump=pump,
                        **_side("pump", got),
                        **_spread("pump_ratio", pump_ratios),
                        pump_ratio_per_round=[round(r, 3) for r in pump_ratios],
                        **_spread("proxy_over_pump", over_pump),
                        pump_cpu_us_per_req=cpu["pump"] * per_request / rounds,
                    )
                rows.append(row)
                _print_row(row)
    finally:
        os.sched_setaffinity(0, affinity)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            if proc.poll() is None:
                proc.kill()
        shutil.rmtree(pump_dir, ignore_errors=True)
        shutil.rmtree(envd_root, ignore_errors=True)
    return rows


# ------------------------------------------------------------------ first request, paused sandbox


def first_request(rounds: int) -> dict[str, object]:
    from e2b import Sandbox

    from shared.bus.server import free_port
    from tests.support.stack import SEED_TEMPLATE, Stack

    samples: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="proxy-bench-") as tmp,
        Stack(Path(tmp), templates={"sandbox-base": SEED_TEMPLATE}).running() as stack,
    ):
        opts = stack.sdk_opts()
        port = free_port()
        sbx = Sandbox.create(
            template="sandbox-base", lifecycle={"on_timeout": "pause", "auto_resume": True}, **opts
        )
        try:
            sbx.commands.run(
                f"python3 -m http.server {port}", background=True, timeout=0, cwd="/workspace"
            )
            headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(port)}
            wait_http(stack.proxy_url + "/", headers)
            for _ in range(rounds):
                assert sbx.pause() is True
                t = time.perf_counter()
                r = httpx.get(stack.proxy_url + "/", headers=headers, timeout=120)
                samples.append(time.perf_counter() - t)
                assert r.status_code == 200, r.text
        finally:
            with contextlib.suppress(Exception):
                sbx.kill()
    samples.sort()
    return {
        "rounds": rounds,
        "p50_ms": statistics.median(samples) * 1000,
        "max_ms": samples[-1] * 1000,
        "samples_ms": [s * 1000 for s in samples],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--resume-rounds", type=int, default=3)
    parser.add_argument(
        "--no-resume", action="store_true", help="skip part 2 (needs the full system)"
    )
    parser.add_argument(
        "--client",
        choices=("httpx", "lean"),
        default="httpx",
        help="httpx (what the SDK uses) or bench/loadgen.py (raw keep-alive sockets, near-free)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a checkout of another commit: its proxy is measured in the same loop, same daemon",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="measurements per cell, the sides alternating which goes first; the ratio is the "
        "median of the rounds' ratios and min-max its spread",
    )
    parser.add_argument(
        "--pump",
        choices=(*PUMPS, "none"),
        default="haproxy",
        help="a reference TCP pump in C measured in the same rounds (the physical limit of one "
        "hop); skipped with a message when not installed",
    )
    parser.add_argument(
        "--client-cpu",
        type=int,
        default=None,
        help="run the client on this CPU alone (the servers keep every CPU): a client on a "
        "machine of its own, as the SDK is in production, instead of one sharing the servers' "
        "cores and caches",
    )
    parser.add_argument(
        "--out", default="proxy_bench.json", help="result file name in bench/results/"
    )
    parser.add_argument(
        "--serve-proxy", nargs=2, metavar=("PORT", "POD_HOST"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.serve_proxy:
        serve_proxy(int(args.serve_proxy[0]), args.serve_proxy[1])
        return 0

    print(
        f"proxy vs direct: {args.requests} requests per cell, {args.rounds} rounds, "
        f"client {args.client}"
        + (f" on CPU {args.client_cpu} alone" if args.client_cpu is not None else "")
        + f", load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    _print_header()
    rows = overhead(
        args.requests,
        args.concurrency,
        client=args.client,
        baseline=args.baseline,
        rounds=args.rounds,
        pump=args.pump,
        client_cpu=args.client_cpu,
    )
    resume: dict[str, object] | None = None
    if not args.no_resume:
        try:
            resume = first_request(args.resume_rounds)
            print(
                f"first request on a paused sandbox (auto-resume): p50 {resume['p50_ms']:.0f} ms, "
                f"max {resume['max_ms']:.0f} ms over {resume['rounds']} rounds"
            )
        except Exception as e:
            resume = {"error": repr(e)[:500]}
            print(f"first-request latency not measured: {resume['error']}")
    # Here, not at the top: the --serve-proxy process stays free of the stack's imports.
    from common import save_result

    save_result(
        args.out,
        {
            "requests": args.requests,
            "rounds": args.rounds,
            "client": args.client,
            "baseline": str(args.baseline) if args.baseline else None,
            "pump": args.pump,
            "client_cpu": args.client_cpu,
            "overhead": rows,
            "first_request_after_pause": resume,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
