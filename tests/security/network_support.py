"""Helpers for the pod network tests: an "outside host" the test itself creates, probes run
inside a namespace, and a check that an instance left nothing behind.

The outside host is a network namespace with its own address in 198.18.0.0/15 (the benchmark
range), routed through the host like any remote machine, running a tiny TCP server that answers
``hello``. Tests never dial an address outside namespaces they (or the runtime under test)
created.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from shared.runtime.local.mounts import mounted_under
from shared.runtime.local.network import guard
from shared.runtime.local.network.names import InstanceNames
from tests.conftest import skip_or_fail

OUTSIDE_RANGE = ipaddress.IPv4Network("198.18.0.0/15")
SERVER = (
    "import socket,sys\n"
    "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(64); print('ready', flush=True)\n"
    "while True:\n"
    "    c,_=s.accept(); c.sendall(b'hello'); c.close()\n"
)
# Prints "ok <first bytes>" or the error's name; never raises. argv: host port [source]
PROBE = (
    "import socket,sys\n"
    "s=socket.socket(); s.settimeout(float(sys.argv[3]) if len(sys.argv)>3 else 2.0)\n"
    "try:\n"
    "    s.connect((sys.argv[1], int(sys.argv[2]))); s.settimeout(2); d=s.recv(16)\n"
    "    print('ok', d.decode(errors='replace'))\n"
    "except OSError as e:\n"
    "    print(type(e).__name__, e.errno)\n"
)

# Runs inside a sandbox or build step: connect to each "host:port" ("gw": the default gateway,
# i.e. the host), print "PROBE {target: ok | error name}", then "SAID {target: what a reached
# peer said}" and the routes. NATS greets first; an HTTP server answers the request.
SANDBOX_PROBE = textwrap.dedent(
    """
    import json, socket, struct, sys
    gw = None
    for line in open("/proc/net/route").read().splitlines()[1:]:
        f = line.split()
        if f[1] == "00000000":
            gw = socket.inet_ntoa(struct.pack("<L", int(f[2], 16)))
    out, said = {}, {}
    for target in sys.argv[1:]:
        host, port = target.rsplit(":", 1)
        s = socket.socket(); s.settimeout(3)
        try:
            s.connect((gw if host == "gw" else host, int(port))); out[target] = "ok"
            said[target] = "from %s:%d" % s.getsockname()
            try:
                s.settimeout(1); s.sendall(b"GET /health HTTP/1.0\\r\\n\\r\\n")
                said[target] += " said %r" % s.recv(160)
            except OSError as e:
                said[target] += " said nothing (%s)" % type(e).__name__
        except OSError as e:
            out[target] = type(e).__name__
        finally:
            s.close()
    routes = open("/proc/net/route").read().replace(chr(10), " / ")
    print("PROBE " + json.dumps(out), flush=True)
    print("SAID " + json.dumps(said) + " ROUTES " + routes, flush=True)
    """
)


def probe_lines(text: str) -> tuple[dict[str, str], str]:
    """SANDBOX_PROBE's results, and its SAID line, from its output."""
    lines = text.splitlines()
    results = [ln.split("PROBE ", 1)[1] for ln in lines if "PROBE " in ln]
    assert len(results) == 1, text
    return json.loads(results[0]), " | ".join(ln for ln in lines if "SAID " in ln)


def require_root_network() -> None:
    if os.geteuid() != 0:
        skip_or_fail("the pod network needs root")
    for tool in ("ip", "nft", "nsenter"):
        if subprocess.run(["which", tool], capture_output=True, check=False).returncode != 0:
            skip_or_fail(f"{tool} is not installed (scripts/setup.sh installs it)")


def sh(*argv: str, stdin: str | None = None, check: bool = True) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        msg = f"{' '.join(argv)}: {done.stderr.strip()}"
        raise AssertionError(msg)
    return done.stdout


def in_netns(netns_path: Path | str, code: str, *args: str, timeout: float = 15) -> str:
    """Run Python ``code`` inside a network namespace; its stdout, stripped."""
    done = subprocess.run(
        ["nsenter", f"--net={netns_path}", "--", sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return (done.stdout + done.stderr).strip()


def probe(netns_path: Path | str, host: str, port: int) -> str:
    return in_netns(netns_path, PROBE, host, str(port))


@dataclass(frozen=True)
class OutsideHost:
    netns: str
    link: str
    address: str  # the server's address, inside the namespace
    host_side: str
    port: int

    @property
    def path(self) -> str:
        return f"/run/netns/{self.netns}"


@pytest.fixture
def outside_host() -> Iterator[OutsideHost]:
    require_root_network()
    tag = secrets.token_hex(3)
    # A random /30 of 198.18.0.0/15; the kernel refuses a duplicate route, so retry on collision.
    for _ in range(20):
        block = list(OUTSIDE_RANGE.subnets(new_prefix=30))[secrets.randbelow(2**15)]
        host_side, inside = block[1], block[2]
        netns, link = f"tt-out-{tag}", f"ttout{tag}"
        sh("ip", "netns", "add", netns)
        sh("ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", netns)
        added = subprocess.run(
            ["ip", "addr", "add", f"{host_side}/30", "dev", link],
            capture_output=True,
            check=False,
        )
        if added.returncode == 0:
            break
        sh("ip", "link", "del", link, check=False)
        sh("ip", "netns", "del", netns, check=False)
    else:
        pytest.fail("no free /30 in 198.18.0.0/15 for the outside host")
    sh("ip", "link", "set", link, "up")
    sh(
        "ip", "-n", netns, "-batch", "-",
        stdin=(
            f"link set lo up\naddr add {inside}/30 dev eth0\nlink set eth0 up\n"
            f"route add default via {host_side}\n"
        ),
    )  # fmt: skip
    port = 18000 + secrets.randbelow(2000)
    server = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{netns}", "--", sys.executable, "-c", SERVER, str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "ready"
        yield OutsideHost(netns, link, str(inside), str(host_side), port)
    finally:
        server.kill()
        server.wait()
        sh("ip", "link", "del", link, check=False)
        sh("ip", "netns", "del", netns, check=False)


def leftovers(data_dir: Path) -> list[str]:
    """Every host object of this data dir's instance that still exists: network objects and
    mounts."""
    names = InstanceNames.for_data_dir(data_dir)
    found = [n for n in os.listdir("/sys/class/net") if n.startswith(names.link_prefix)]
    if os.path.isdir("/run/netns"):
        found += [n for n in os.listdir("/run/netns") if n.startswith(f"torpor-{names.instance}-")]
    tables = sh("nft", "list", "tables")
    if names.table in tables.split():
        found.append(f"table {names.table}")
    mounts = Path("/proc/self/mountinfo").read_text()
    found += [
        f"mount {line.split()[4]}"
        for line in mounts.splitlines()
        if f"torpor-{names.instance}-" in line
    ]
    # What its pods mounted (roots, lowers, workspaces, layers) outlives them unless unmounted.
    found += [f"mount {point}" for point in mounted_under(data_dir)]
    return found


def wait_until(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


@contextlib.contextmanager
def host_listener(host: str) -> Iterator[tuple[int, list[object]]]:
    """A TCP service of the host bound on ``host``; yields its port and the peers it saw."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, 0))
    server.listen(16)
    server.settimeout(0.2)
    seen: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, peer = server.accept()
                seen.append(peer)
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], seen
    finally:
        stop.set()
        thread.join(2)
        server.close()


def host_addresses() -> list[str]:
    """The host's own IPv4 addresses but loopback: what a sandbox must not reach."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    return [a for a in re.findall(r"inet (\d+\.\d+\.\d+\.\d+)/", out) if not a.startswith("127.")]


def reach_diagnosis(reached: Mapping[str, str], names: Mapping[int, str]) -> str:
    """The host's side of a probe that reached something it must not: which listener holds each
    reached port (and what the test calls it), the host's addresses, conntrack entries of those
    ports, interfaces that take packets for 127/8 or from local sources, every NAT-like rule, and
    the guard's chains. A failure of an isolation test must say what answered."""
    ports = {t.rsplit(":", 1)[1] for t in reached}
    listening = sh("ss", "-ltnpH", check=False).splitlines()
    try:
        with open("/proc/net/nf_conntrack") as f:
            tracked = [ln.strip() for ln in f if any(f"port={p} " in ln for p in ports)]
    except OSError as e:
        tracked = [repr(e)]
    risky = []
    for conf in sorted(os.listdir("/proc/sys/net/ipv4/conf")):
        for knob in ("route_localnet", "accept_local"):
            if Path(f"/proc/sys/net/ipv4/conf/{conf}/{knob}").read_text().strip() != "0":
                risky.append(f"{conf}/{knob}")
    ruleset = sh("nft", "list", "ruleset", check=False).splitlines()
    nat = [ln.strip() for ln in ruleset if re.search(r"dnat|redirect|tproxy", ln, re.IGNORECASE)]
    return "\n".join(
        [
            "",
            "ports: " + ", ".join(f"{p}={n}" for p, n in names.items()),
            "listeners: " + "; ".join(ln for ln in listening if any(f":{p} " in ln for p in ports)),
            "host addresses: " + ", ".join(host_addresses()),
            "conntrack: " + " | ".join(tracked),
            "route_localnet/accept_local on: " + ", ".join(risky),
            "nat rules: " + " | ".join(nat),
            "guard: " + sh("nft", "list", "table", "inet", guard.TABLE, check=False),
        ]
    )
