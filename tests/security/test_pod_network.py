"""The pod network module on its own (real namespaces, veths, nftables; no runtime): isolation,
NAT, egress policy, instance scoping and exact cleanup. Processes entered into a pod's namespace
with ``nsenter`` stand in for pods here; tests/security/test_network_isolation.py runs real
sandboxes."""

from __future__ import annotations

import contextlib
import ipaddress
import random
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shared.errors import ConfigError
from shared.models.network import NetworkPolicy
from shared.runtime.local.network import PodNetwork, guard, nftables
from shared.runtime.local.network.names import InstanceNames, pod_net_id
from tests.conftest import skip_or_fail
from tests.security.network_support import (
    OutsideHost,
    host_listener,
    in_netns,
    leftovers,
    probe,
    require_root_network,
    sh,
)

LISTENER = (
    "import socket,sys\n"
    "s=socket.socket(); s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(8)\n"
    "print('ready', flush=True)\n"
    "while True:\n"
    "    c,_=s.accept(); c.sendall(b'pod'); c.close()\n"
)


@pytest.fixture
async def network(tmp_path: Path) -> AsyncIterator[PodNetwork]:
    require_root_network()
    net = await PodNetwork(tmp_path / "data").open()
    try:
        yield net
    finally:
        subnet = net.subnet
        await net.release()
        assert leftovers(tmp_path / "data") == []
        assert str(subnet) not in sh("ip", "route", "show", "table", "all")


def _listen(net: PodNetwork, net_id: str, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        ["nsenter", f"--net={net.netns_path(net_id)}", "--", sys.executable, "-c", LISTENER,
         "0.0.0.0", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


async def test_isolation_and_nat(network: PodNetwork, outside_host: OutsideHost) -> None:
    net = network
    alice, bob = "a11ce00", "b0b0000"
    alice_ip, bob_ip = net.address(2), net.address(3)
    await net.setup(alice, alice_ip, NetworkPolicy())
    await net.setup(bob, bob_ip, NetworkPolicy())
    assert ipaddress.ip_address(alice_ip) in net.subnet
    ns = net.netns_path(alice)
    servers = [_listen(net, alice, 7000), _listen(net, bob, 7000)]
    host_server = subprocess.Popen(
        [sys.executable, "-c", LISTENER, "0.0.0.0", "7001"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert host_server.stdout is not None
        assert host_server.stdout.readline().strip() == "ready"
        # The host (control plane) reaches each pod at its address.
        assert in_netns("/proc/self/ns/net", _PROBE_HOST, alice_ip, "7000") == "ok pod"
        # The outside, through NAT.
        assert probe(ns, outside_host.address, outside_host.port) == "ok hello"
        # Not the host: gateway, its other addresses, loopback; not the other pod.
        host_addresses = sh("ip", "-4", "-o", "addr", "show").split()
        eth = [a.split("/")[0] for a in host_addresses if a.count(".") == 3 and "/" in a]
        for target in [str(net.gateway), outside_host.host_side, *eth]:
            assert not probe(ns, target, 7001).startswith("ok"), target
        assert probe(ns, "127.0.0.1", 7001).startswith("ConnectionRefused")  # its own lo
        assert not probe(ns, bob_ip, 7000).startswith("ok")
        # A forged source (another pod's address, bound with IP_FREEBIND) gets nowhere.
        forged = in_netns(ns, _PROBE_FROM, bob_ip, outside_host.address, str(outside_host.port))
        assert not forged.startswith("ok"), forged
        # The pod cannot change its own addresses or routes: it would need CAP_NET_ADMIN over
        # the namespace, which belongs to the host's user namespace (bwrap drops every cap).
        rc = subprocess.run(
            ["nsenter", f"--net={ns}", "--", "setpriv", "--inh-caps=-all", "--bounding-set=-all",
             "ip", "addr", "add", f"{bob_ip}/32", "dev", "eth0"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert rc.returncode != 0 and "Operation not permitted" in rc.stderr
    finally:
        for proc in [*servers, host_server]:
            proc.kill()
            proc.wait()
        await net.teardown(alice, alice_ip)
        await net.teardown(bob, bob_ip)


async def test_a_pod_reaches_no_host_address_but_its_gateway_whatever_the_host_holds(
    network: PodNetwork, outside_host: OutsideHost
) -> None:
    """The guard refuses a pod's packet to a host address outside the pod ranges before
    connection tracking, NAT and routing: no translation, route or connection state of the host
    makes one pass. The host here is set up the worst way: the pod's link takes packets for
    127/8 (``route_localnet``), a DNAT of the test's own sends the pod's connection to the outside
    link's host address on to a 127.0.0.1 listener, and the host opens a connection to the pod
    from that address, so the pod's answer would be a reply ("established")."""
    net, pod = network, "d0a7000"
    address = net.address(7)
    await net.setup(pod, address, NetworkPolicy())
    ns, link, port = net.netns_path(pod), net.names.link(pod), 7003
    table = f"torpor_test_{pod}"
    loopback = subprocess.Popen(
        [sys.executable, "-c", LISTENER, "127.0.0.1", str(port)], stdout=subprocess.PIPE, text=True
    )
    server = _listen(net, pod, 7000)
    try:
        assert loopback.stdout is not None
        assert loopback.stdout.readline().strip() == "ready"
        sh("sysctl", "-q", "-w", f"net.ipv4.conf.{link}.route_localnet=1")
        sh(
            "nft", "-f", "-",
            stdin=(
                f"add table ip {table}\n"
                f"add chain ip {table} pre {{ type nat hook prerouting priority dstnat; }}\n"
                f'add rule ip {table} pre iifname "{link}" ip daddr {outside_host.host_side} '
                f"tcp dport {port} dnat to 127.0.0.1:{port}\n"
            ),
        )  # fmt: skip
        got = probe(ns, outside_host.host_side, port)
        assert not got.startswith("ok"), got
        # The host's own connection to the pod: from the gateway (the pod route's source) it
        # works; from another host address the pod's answer never arrives.
        gateway = in_netns("/proc/self/ns/net", _PROBE_FROM, str(net.gateway), address, "7000")
        assert gateway == "ok b'pod'"
        other = in_netns("/proc/self/ns/net", _PROBE_FROM, outside_host.host_side, address, "7000")
        assert not other.startswith("ok"), other
    finally:
        sh("nft", "delete", "table", "ip", table, check=False)
        for proc in (loopback, server):
            proc.kill()
            proc.wait()
        await net.teardown(pod, address)


async def test_a_pod_opens_nothing_to_the_host_whatever_its_connection_state(
    network: PodNetwork,
) -> None:
    """The host's connection tracking says a pod's flows to its gateway are established (entries
    forged with ``conntrack -I``, as a stale entry of an address's previous pod, a helper's
    expectation or another tool would leave): the pod still opens no TCP connection to the host
    and gets no datagram to it. The guard refuses a pod's connection opening (a TCP SYN without
    ACK) and every datagram to any host address before connection tracking sees it, so no state
    of the host's lets one pass. The host's own connection to the pod still works."""
    require_conntrack()
    net, pod = network, "d0a7100"
    address = net.address(8)
    await net.setup(pod, address, NetworkPolicy())
    ns, gw, sport = net.netns_path(pod), str(net.gateway), 41234
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("0.0.0.0", 0))
    udp.settimeout(1.0)
    uport = udp.getsockname()[1]
    server = _listen(net, pod, 7000)
    forged: list[list[str]] = []
    try:
        with host_listener("0.0.0.0") as (tport, seen):
            for proto, dport, state in (
                ("tcp", tport, ["--state", "ESTABLISHED"]),
                ("udp", uport, []),
            ):
                forged.append([
                    "-p", proto, "-s", address, "-d", gw, "--sport", str(sport),
                    "--dport", str(dport), "-r", gw, "-q", address,
                    "--reply-port-src", str(dport), "--reply-port-dst", str(sport),
                ])  # fmt: skip
                sh("conntrack", "-I", *forged[-1], *state, "-u", "SEEN_REPLY,ASSURED", "-t", "120")
            got = in_netns(ns, _PROBE_FROM_PORT, address, str(sport), gw, str(tport))
            assert not got.startswith("ok"), got
            in_netns(ns, _SEND_UDP, address, str(sport), gw, str(uport))
            with contextlib.suppress(TimeoutError):
                udp.recvfrom(64)
                pytest.fail("a pod's datagram reached the host")
            assert seen == []
        # The host's own connection to the pod (from the gateway) still works.
        assert in_netns("/proc/self/ns/net", _PROBE_FROM, gw, address, "7000") == "ok b'pod'"
    finally:
        for entry in forged:
            sh("conntrack", "-D", *entry[:10], check=False)
        udp.close()
        server.kill()
        server.wait()
        await net.teardown(pod, address)


async def test_policy_live_and_exact(network: PodNetwork, outside_host: OutsideHost) -> None:
    net, pod, address = network, "5005005", network.address(5)
    await net.setup(pod, address, NetworkPolicy(allow_internet=False))
    ns, target = net.netns_path(pod), outside_host.address
    try:
        assert not probe(ns, target, outside_host.port).startswith("ok")
        block = str(ipaddress.ip_network(f"{target}/30", strict=False))
        cases = [
            (NetworkPolicy(), True),
            (NetworkPolicy(deny_out=(block,)), False),
            (NetworkPolicy(deny_out=("0.0.0.0/0",), allow_out=(f"{target}/32",)), True),
            (NetworkPolicy(allow_internet=False, allow_out=(block,)), True),
            (NetworkPolicy(deny_out=(f"{target}",), allow_out=("10.0.0.0/8",)), False),
        ]
        for policy, reachable in cases:
            await net.apply_policy(pod, address, policy)  # live: the namespace and link stay
            assert policy.permits(target) is reachable
            got = probe(ns, target, outside_host.port)
            assert got.startswith("ok") is reachable, (policy, got)
    finally:
        await net.teardown(pod, address)
    assert leftovers(net._data_dir) == [f"table {net.names.table}"]


def test_rendered_policy_is_the_models_rule() -> None:
    """The rendered allow/deny lists decide exactly as NetworkPolicy.permits (random policies)."""
    rng = random.Random(14)

    def cidr() -> str:
        return f"{rng.randrange(256)}.{rng.randrange(256)}.0.0/{rng.choice([8, 12, 16, 24, 32])}"

    for _ in range(200):
        policy = NetworkPolicy(
            allow_internet=rng.random() < 0.5,
            allow_out=tuple(cidr() for _ in range(rng.randrange(4))),
            deny_out=tuple(cidr() for _ in range(rng.randrange(4))),
        )
        for _ in range(50):
            address = str(ipaddress.IPv4Address(rng.getrandbits(32)))
            assert nftables.permits(policy, address) == policy.permits(address)


async def test_instances_get_distinct_ranges_and_names(tmp_path: Path) -> None:
    require_root_network()
    one = await PodNetwork(tmp_path / "one").open()
    two = await PodNetwork(tmp_path / "two").open()
    try:
        assert not one.subnet.overlaps(two.subnet)
        assert one.names.table != two.names.table
        # The same data dir adopts its range (what a restart after kill -9 does).
        again = await PodNetwork(tmp_path / "one").open()
        assert again.subnet == one.subnet
        # An explicit range that overlaps another instance's: one readable line.
        with pytest.raises(ConfigError, match=r"TORPOR_POD_CIDR .* overlaps"):
            await PodNetwork(tmp_path / "three", pod_cidr=str(one.subnet)).open()
        assert leftovers(tmp_path / "three") == []
    finally:
        await one.release()
        await two.release()
    assert leftovers(tmp_path / "one") == leftovers(tmp_path / "two") == []


async def test_the_guard_outlives_instances_and_closes_a_released_ones_links(
    tmp_path: Path,
) -> None:
    """The host-wide guard (network/guard.py): made by every instance, deleted by none; a
    released instance is marked there in the transaction that deletes its table, and unmarked
    when it opens again; its listing loads back (nft 1.0.6 lists some sets as garbage)."""
    require_root_network()
    one = await PodNetwork(tmp_path / "one").open()
    glob, gateway = one.names.link_glob, str(one.gateway)

    def released() -> str:
        return sh("nft", "list", "set", "inet", guard.TABLE, "released")

    try:
        assert f'"{glob}"' not in released()
        sh("nft", "get", "element", "inet", guard.TABLE, "ranges", "{", gateway, "}")
        await one.release()
        assert guard.TABLE in sh("nft", "list", "tables")
        assert f'"{glob}"' in released()
        sh("nft", "get", "element", "inet", guard.TABLE, "ranges", "{", gateway, "}")
        listing = sh("nft", "list", "table", "inet", guard.TABLE)
        sh("nft", "-c", "-f", "-", stdin=listing)
        again = await PodNetwork(tmp_path / "one").open()
        assert f'"{glob}"' not in released()
        await again.release()
    finally:
        await one.release()
    assert leftovers(tmp_path / "one") == []


@pytest.mark.parametrize(
    "value",
    ["8.8.8.0/24", "127.0.0.0/16", "10.0.0.0/8", "10.1.2.0/30", "--ro-bind", "10.0.0.1\0/24",
     "fd00::/64", "10.1.2.3/24", "x" * 10_000, ""],
)  # fmt: skip
def test_hostile_range_settings(value: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="TORPOR_POD_CIDR"):
        PodNetwork(tmp_path, pod_cidr=value)


async def test_sweep_keeps_live_pods_and_removes_the_rest(network: PodNetwork) -> None:
    net = network
    pods = {f"000000{i}": net.address(i) for i in (2, 3, 4)}
    for net_id, address in pods.items():
        await net.setup(net_id, address, NetworkPolicy())
    # A restarted runtime knows pod 0000003 still runs; the two others are leftovers.
    fresh = await PodNetwork(net._data_dir).open()
    await fresh.sweep({"0000003": (pods["0000003"], NetworkPolicy(allow_internet=False))})
    prefix = net.names.link_prefix
    assert [n for n in leftovers(net._data_dir) if n.startswith(prefix)] == [
        net.names.link("0000003")
    ]
    listing = sh("nft", "list", "table", "inet", net.names.table)
    assert nftables.chains_of(listing).count(net.names.chain("0000003")) == 1
    assert net.names.chain("0000002") not in listing and "0.0.0.0/0" in listing
    await fresh.teardown("0000003", pods["0000003"])


def test_names_are_validated() -> None:
    n = InstanceNames.for_data_dir(Path("/tmp/x"))
    assert n.id_of_link(n.link("00000a2")) == "00000a2"
    assert n.id_of_link(n.link("00000a2") + "x") is None
    assert n.id_of_netns(f"{n.netns_prefix}../x") is None
    assert n.id_of_chain("egress_0000001") == "0000001"
    for hostile in ["../../x", "--ro-bind", "0000000\0", "ABCDEFG", "00000000", ""]:
        with pytest.raises(ValueError, match="pod network id"):
            n.link(hostile)
    assert len(n.link("fffffff")) <= 15
    assert pod_net_id("3f2a9c1e-0000-4000-8000-000000000000") == "3f2a9c1"
    with pytest.raises(ValueError, match="7 hex"):
        pod_net_id("../../etc")


_PROBE_HOST = (
    "import socket,sys\n"
    "s=socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)\n"
    "print('ok', s.recv(16).decode())\n"
)
_PROBE_FROM_PORT = (
    "import socket,sys\n"
    "s=socket.socket(); s.settimeout(2)\n"
    "s.bind((sys.argv[1], int(sys.argv[2])))\n"
    "try:\n"
    "    s.connect((sys.argv[3], int(sys.argv[4]))); print('ok', s.recv(16))\n"
    "except OSError as e:\n"
    "    print(type(e).__name__)\n"
)
_SEND_UDP = (
    "import socket,sys\n"
    "s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], int(sys.argv[2])))\n"
    "s.sendto(b'hello', (sys.argv[3], int(sys.argv[4])))\n"
)


def require_conntrack() -> None:
    if subprocess.run(["which", "conntrack"], capture_output=True, check=False).returncode != 0:
        skip_or_fail("conntrack is not installed (scripts/setup.sh installs it)")


_PROBE_FROM = (
    "import socket,sys\n"
    "s=socket.socket(); s.settimeout(2)\n"
    "s.setsockopt(socket.SOL_IP, 15, 1)  # IP_FREEBIND\n"
    "s.bind((sys.argv[1], 0))\n"
    "try:\n"
    "    s.connect((sys.argv[2], int(sys.argv[3]))); print('ok', s.recv(16))\n"
    "except OSError as e:\n"
    "    print(type(e).__name__)\n"
)
