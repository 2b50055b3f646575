"""From inside a sandbox (code run through the unmodified e2b SDK against a real stack), the
network reaches nothing of the host or of other sandboxes: not NATS, the API, the proxy, host
services on 0.0.0.0 or 127.0.0.1, the pod's gateway, nor another sandbox's daemon or user
ports, also while another instance's pod network comes and goes and while the sandbox's own
instance has no rules at all; and while a sandbox is paused, nobody can receive on its address."""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import socket
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
from e2b import Sandbox

from shared.models.network import OPEN
from shared.runtime.local.network import PodNetwork, links
from shared.runtime.local.network.names import InstanceNames
from tests.security.network_support import PROBE as NS_PROBE
from tests.security.network_support import (
    SANDBOX_PROBE,
    OutsideHost,
    host_addresses,
    host_listener,
    in_netns,
    probe_lines,
    reach_diagnosis,
    require_root_network,
    sh,
)
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

# Runs inside the sandbox: listen on an address that is not its own (IP_FREEBIND lets the bind
# succeed), report any connection that arrives within the given seconds.
SQUAT = textwrap.dedent(
    """
    import socket, sys
    s = socket.socket(); s.setsockopt(socket.SOL_IP, 15, 1)  # IP_FREEBIND
    s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(8); s.settimeout(float(sys.argv[3]))
    print("listening", flush=True)
    try:
        c, peer = s.accept(); print("RECEIVED", peer, c.recv(100), flush=True)
    except OSError:
        print("nothing", flush=True)
    """
)
USER_SERVER = (
    "import http.server as h; h.HTTPServer(('0.0.0.0', 8080), h.SimpleHTTPRequestHandler)"
    ".serve_forever()"
)


def pod_address(sbx: Sandbox) -> str:
    # The sandbox rootfs has no iproute2: `hostname -I` here, the kernel's route table below.
    out = sbx.commands.run("hostname -I").stdout.split()
    assert len(out) == 1 and re.fullmatch(r"\d+\.\d+\.\d+\.\d+", out[0]), out
    return out[0]


def gateway(sbx: Sandbox) -> str:
    read = (
        "import socket, struct\n"
        "for line in open('/proc/net/route').read().splitlines()[1:]:\n"
        "    f = line.split()\n"
        "    if f[1] == '00000000':\n"
        "        print(socket.inet_ntoa(struct.pack('<L', int(f[2], 16))))\n"
    )
    sbx.files.write("/tmp/gateway.py", read)
    out = sbx.commands.run("python3 /tmp/gateway.py").stdout.split()
    assert len(out) == 1 and re.fullmatch(r"\d+\.\d+\.\d+\.\d+", out[0]), out
    return out[0]


def probe_said(sbx: Sandbox, targets: list[str]) -> tuple[dict[str, str], str]:
    """Each target's result ("ok" or the error's name), and what each reached peer said."""
    sbx.files.write("/tmp/probe.py", SANDBOX_PROBE)
    result = sbx.commands.run("python3 /tmp/probe.py " + " ".join(targets), timeout=120)
    return probe_lines(result.stdout)


def probe(sbx: Sandbox, targets: list[str]) -> dict[str, str]:
    return probe_said(sbx, targets)[0]


def test_a_sandbox_reaches_nothing_of_the_host_or_other_sandboxes(stack: Stack) -> None:
    require_root_network()
    alice = Sandbox.create(template="sandbox-base", timeout=300, **stack.sdk_opts("alice"))
    bob = Sandbox.create(template="sandbox-base", timeout=300, **stack.sdk_opts("bob"))
    try:
        bob.commands.run(f'python3 -c "{USER_SERVER}"', background=True, timeout=0)
        bob_ip, alice_gw = pod_address(bob), gateway(alice)
        # Positive controls: the host reaches bob's user port (through the proxy) and alice's
        # own daemon answers her SDK.
        headers = {"E2b-Sandbox-Id": bob.sandbox_id, "E2b-Sandbox-Port": "8080"}
        deadline = time.monotonic() + 30
        while httpx.get(stack.proxy_url + "/", headers=headers, timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "bob's user port never answered via the proxy"
            time.sleep(0.3)
        assert alice.commands.run("echo alive").stdout.strip() == "alive"

        ports = {
            "nats": urlparse(stack.nats_url).port,
            "api": urlparse(stack.api_url).port,
            "proxy": urlparse(stack.proxy_url).port,
        }
        with (
            host_listener("0.0.0.0") as (any_port, seen_any),
            host_listener("127.0.0.1") as (
                lo_port,
                seen_lo,
            ),
        ):
            hosts = ["127.0.0.1", alice_gw, *host_addresses()]
            targets = [f"{h}:{p}" for h in hosts for p in [*ports.values(), any_port, lo_port]]
            targets += [f"{bob_ip}:49983", f"{bob_ip}:8080"]
            own = f"{pod_address(alice)}:49983"  # the probe works: alice's own daemon answers
            results, said = probe_said(alice, [*targets, own])
            assert results.pop(own) == "ok"
            assert set(results) == set(targets)
            reached = {t: r for t, r in results.items() if r == "ok"}
            names = {**{p: k for k, p in ports.items() if p}, any_port: "0.0.0.0", lo_port: "lo"}
            assert reached == {}, (
                f"alice reached {reached}, seen {seen_any} {seen_lo}: {said}"
                + reach_diagnosis(reached, names)
            )
            assert seen_any == [] and seen_lo == []
    finally:
        alice.kill()
        bob.kill()


def test_nobody_receives_on_a_paused_sandboxs_address(stack: Stack) -> None:
    require_root_network()
    alice = Sandbox.create(template="sandbox-base", timeout=300, **stack.sdk_opts("alice"))
    bob = Sandbox.create(template="sandbox-base", timeout=300, **stack.sdk_opts("bob"))
    try:
        bob_ip = pod_address(bob)
        bob.pause()
        # A plain bind to bob's address fails; with IP_FREEBIND it "succeeds" but nothing
        # addressed to bob ever arrives there.
        plain = alice.commands.run(
            f"python3 -c \"import socket; socket.socket().bind(('{bob_ip}', 49983))\" 2>&1 || true"
        )
        assert "Cannot assign requested address" in plain.stdout
        alice.files.write("/tmp/squat.py", SQUAT)
        squat = alice.commands.run(f"python3 /tmp/squat.py {bob_ip} 49983 8", background=True)
        time.sleep(1.0)
        with pytest.raises(OSError):  # the host's route for a paused pod's address: unreachable
            socket.create_connection((bob_ip, 49983), timeout=3).close()
        assert "nothing" in squat.wait().stdout

        resumed = Sandbox.connect(bob.sandbox_id, **stack.sdk_opts("bob"))
        assert pod_address(resumed) == bob_ip  # reserved for bob while paused
        assert resumed.commands.run("echo back").stdout.strip() == "back"
    finally:
        alice.kill()
        bob.kill()


@contextlib.contextmanager
def table_deleted(data_dir: Path) -> Iterator[None]:
    """The instance's nft table is gone for the block (as while its network is released or
    rebuilt and a pod still runs); put back as it was afterwards."""
    table = InstanceNames.for_data_dir(data_dir).table
    saved = sh("nft", "list", "table", "inet", table)
    sh("nft", "delete", "table", "inet", table)
    try:
        yield
    finally:
        sh("nft", "-f", "-", stdin=f"add table inet {table}\ndelete table inet {table}\n{saved}")


def test_a_sandbox_reaches_nothing_while_pod_networks_churn(
    stack: Stack, outside_host: OutsideHost, tmp_path: Path
) -> None:
    """The conditions of a CI failure ("alice reached {'10.224.48.1:34935': 'ok'}", the gateway
    of another instance's pod range), provoked: another instance's gateway is a host address;
    then that instance releases its network, so the address leads where something answers (here
    the outside host; on CI the default route), and a process of it still running makes a pod
    link; then alice's own instance has no table at all. Nothing of it is reachable, while the
    outside host is (the probes work)."""
    require_root_network()
    other = PodNetwork(tmp_path / "other")
    asyncio.run(other.open())
    other_gw, pod, late = str(other.gateway), other.address(2), secrets.token_hex(4)[:7]
    alice = Sandbox.create(template="sandbox-base", timeout=300, **stack.sdk_opts("alice"))
    bob = Sandbox.create(template="sandbox-base", timeout=300, **stack.sdk_opts("bob"))
    outside = f"{outside_host.address}:{outside_host.port}"
    try:
        bob.commands.run(f'python3 -c "{USER_SERVER}"', background=True, timeout=0)
        bob_ip = pod_address(bob)
        with host_listener("0.0.0.0") as (port, seen):
            asyncio.run(other.setup(secrets.token_hex(4)[:7], pod, OPEN))
            assert other_gw in host_addresses()
            first = probe(alice, [f"{other_gw}:{port}", f"{pod}:{port}", outside])

            asyncio.run(other.release())
            assert other_gw not in host_addresses()
            for address in (other_gw, pod):
                sh("ip", "-n", outside_host.netns, "addr", "add", f"{address}/32", "dev", "eth0")
                sh("ip", "route", "add", f"{address}/32", "via", outside_host.address)
            at = outside_host.port
            second = probe(alice, [f"{other_gw}:{at}", f"{pod}:{at}", outside])
            # A pool refill of the released instance: a link and namespace, rules never made.
            net = other.names
            asyncio.run(
                links.create(
                    "ip", netns=net.netns(late), link=net.link(late), address=other.address(3),
                    gateway=other.gateway,
                )
            )  # fmt: skip
            from_late = {
                target: in_netns(other.netns_path(late), NS_PROBE, *target.split(":"))
                for target in [f"{other_gw}:{port}", outside, f"{bob_ip}:8080"]
            }

            host = [f"{h}:{port}" for h in [gateway(alice), *host_addresses()]]
            with table_deleted(stack.data_dir):
                third = probe(alice, [*host, f"{bob_ip}:8080", f"{bob_ip}:49983", outside])
        reached = {}
        for phase, results in {"first": first, "second": second, "third": third}.items():
            assert results.pop(outside) == "ok", results  # the probe works
            reached |= {f"{phase} {t}": r for t, r in results.items() if r == "ok"}
        reached |= {f"late pod {t}": r for t, r in from_late.items() if r.startswith("ok")}
        assert reached == {}, f"reached {reached}"
        assert seen == []
    finally:
        for address in (other_gw, pod):
            sh("ip", "route", "del", f"{address}/32", check=False)
        asyncio.run(other.release())
        alice.kill()
        bob.kill()
