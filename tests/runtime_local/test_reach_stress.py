"""The intermittent pod -> host reach (five CI sightings, issue 32 item 5), provoked: two local
runtimes side by side create, pause, resume and kill sandboxes in a loop (pod addresses are
reused, conntrack entries of earlier pods linger, networks come and go), while a prober enters
EVERY pod network namespace that exists at that instant (starting, running, stopping pods) and
dials every host target: listeners of the test's own on 0.0.0.0, 127.0.0.1 and addresses it adds
to the host (one of which it removes and puts back while probing, an address that stops being
local), the other runtime's gateway and the host's own addresses. Nothing may answer; when
anything does, the failure carries conntrack, routes and the guard as they were at that moment.

Bounded: ``TORPOR_REACH_STRESS_SECONDS`` (default 75) of churn. Traffic stays on this machine:
every target is a host address, a test-made address or loopback."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import secrets
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.ports.workloads import WorkloadSpec
from shared.runtime.local.network import links
from shared.runtime.local.network.names import InstanceNames
from tests.runtime_local.support import LocalRuntimeFactory
from tests.security.network_support import host_addresses, host_listener, require_root_network, sh

pytestmark = pytest.mark.slow

SECONDS = float(os.environ.get("TORPOR_REACH_STRESS_SECONDS", "75"))
READY = 60.0
# A /29 of the benchmark range for the test's own host addresses (a dummy link, never routed out).
_EXTRA = ipaddress.IPv4Network("198.18.0.0/15")

# Runs in a pod's network namespace: dials every "host:port" (short timeouts: the guard refuses
# at once), prints the reached ones with the probe's source and what the peer said, as JSON.
PROBE = textwrap.dedent(
    """
    import json, socket, sys
    reached = {}
    for target in sys.argv[1:]:
        host, port = target.rsplit(":", 1)
        s = socket.socket(); s.settimeout(0.5)
        try:
            s.connect((host, int(port)))
            note = "from %s:%d" % s.getsockname()
            try:
                s.settimeout(0.5); note += " said %r" % s.recv(64)
            except OSError as e:
                note += " said nothing (%s)" % type(e).__name__
            reached[target] = note
        except OSError:
            pass
        finally:
            s.close()
    print(json.dumps(reached))
    """
)


def _pod_namespaces(*prefixes: str) -> list[str]:
    return [n for p in prefixes for n in links.own_netns(p)]


def _state(reached: dict[str, str]) -> str:
    """The host's side at the moment something answered."""
    try:
        ports = {t.rsplit(":", 1)[1] for t in reached}
        with open("/proc/net/nf_conntrack") as f:
            tracked = [ln.strip() for ln in f if any(f"port={p} " in ln for p in ports)]
    except OSError as e:
        tracked = [repr(e)]
    return "\n".join(
        [
            "conntrack: " + " | ".join(tracked),
            "addresses: " + ", ".join(host_addresses()),
            "routes: "
            + sh("ip", "route", "show", "table", "all", check=False).replace("\n", " | "),
            "guard: " + sh("nft", "list", "table", "inet", "torpor_guard", check=False),
        ]
    )


@contextlib.contextmanager
def extra_addresses(count: int) -> Iterator[tuple[str, list[str]]]:
    """A link of the test's (a veth into a namespace it makes: this kernel may lack dummy links)
    with ``count`` host addresses (198.18.0.0/15)."""
    tag = secrets.token_hex(3)
    link, netns = f"ttrs{tag}", f"tt-rs-{tag}"
    block = list(_EXTRA.subnets(new_prefix=29))[secrets.randbelow(2**14)]
    addresses = [str(a) for a in list(block.hosts())[:count]]
    sh("ip", "netns", "add", netns)
    try:
        sh("ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", netns)
        for a in addresses:
            sh("ip", "addr", "add", f"{a}/32", "dev", link)
        sh("ip", "link", "set", link, "up")
        yield link, addresses
    finally:
        sh("ip", "link", "del", link, check=False)
        sh("ip", "netns", "del", netns, check=False)


class Prober:
    """Probes from every pod namespace of the given instances, round after round, in a thread,
    until stopped; flaps one test-made address between rounds."""

    def __init__(self, prefixes: list[str], ports: list[int], flap: tuple[str, str]) -> None:
        self.prefixes, self.ports, self.flap = prefixes, ports, flap
        self.rounds = self.probes = 0
        self.reached: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        link, flapping = self.flap
        while not self._stop.is_set():
            if self.rounds % 2:
                sh("ip", "addr", "del", f"{flapping}/32", "dev", link, check=False)
            else:
                sh("ip", "addr", "add", f"{flapping}/32", "dev", link, check=False)
            hosts = ["127.0.0.1", *host_addresses()]  # eth0, every gateway, the test's addresses
            targets = [f"{a}:{p}" for a in hosts for p in self.ports]
            procs = {
                ns: subprocess.Popen(
                    [
                        "nsenter",
                        f"--net={links.netns_path(ns)}",
                        "--",
                        sys.executable,
                        "-c",
                        PROBE,
                        *targets,
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
                for ns in _pod_namespaces(*self.prefixes)
            }
            for ns, proc in procs.items():
                try:
                    out, _ = proc.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    continue
                if proc.returncode != 0 or not out.strip():
                    continue  # the namespace went while entering it
                self.probes += 1
                reached = json.loads(out.strip().splitlines()[-1])
                if reached:
                    self.reached.append(f"{ns} reached {reached}\n{_state(reached)}")
            self.rounds += 1


async def _cycle(runtime: object, names: list[str], owner: str) -> None:
    """Create, pause, resume and kill the workloads (a cycle of one runtime)."""
    from shared.runtime.local import LocalRuntime

    assert isinstance(runtime, LocalRuntime)
    for name in names:
        await runtime.create(WorkloadSpec(name=name, owner=owner))
    await asyncio.gather(*(runtime.wait_ready(n, timeout=READY) for n in names))
    await runtime.scale(names[0], 0)  # pause one, resume it
    await runtime.wait_stopped(names[0], timeout=READY)
    await runtime.scale(names[0], 1)
    await runtime.wait_ready(names[0], timeout=READY)
    for name in names:
        await runtime.delete(name)
    for name in names:
        await runtime.wait_stopped(name, timeout=READY)


@pytest.mark.timeout(SECONDS + 240)  # the churn, plus the runtimes' start and stop
async def test_no_pod_reaches_the_host_under_churn(
    local_runtime: LocalRuntimeFactory, tmp_path: Path
) -> None:
    require_root_network()
    first = await local_runtime()
    second = await local_runtime(data_dir=tmp_path / "second", bucket=f"wl_{uuid.uuid4().hex[:12]}")
    prefixes = [
        InstanceNames.for_data_dir(d).netns_prefix for d in (first._data_dir, second._data_dir)
    ]
    with (
        extra_addresses(3) as (link, extra),
        host_listener("0.0.0.0") as (any_port, seen_any),
        host_listener("127.0.0.1") as (lo_port, seen_lo),
        host_listener(extra[0]) as (extra_port, seen_extra),
    ):
        ports = [any_port, lo_port, extra_port]
        with Prober(prefixes, ports, (link, extra[1])) as prober:
            deadline, cycles = time.monotonic() + SECONDS, 0
            while time.monotonic() < deadline and not prober.reached:
                tag = secrets.token_hex(3)
                await asyncio.gather(
                    _cycle(first, [f"rs{tag}a{i}" for i in range(3)], "alice"),
                    _cycle(second, [f"rs{tag}b{i}" for i in range(2)], "bob"),
                )
                cycles += 1
        print(f"reach stress: {cycles} cycles, {prober.rounds} rounds, {prober.probes} probes")
        assert prober.reached == [], "\n\n".join(prober.reached)
        assert seen_any == seen_lo == seen_extra == []
        assert cycles >= 1 and prober.probes >= cycles, (cycles, prober.probes)
