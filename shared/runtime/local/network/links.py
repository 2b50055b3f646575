"""A pod's network namespace and its veth pair, made and removed with ``ip``.

Routed point-to-point links, no bridge: the pod's ``eth0`` holds its address as a /32 and a
default route to the gateway (the range's first address, also a /32 on every host-side link);
the host routes the pod's /32 to that link only. Pods share no L2 segment, so one pod cannot
ARP for, or answer as, another; a packet for a pod's address can only reach that pod's link.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from shared.runtime.local.network.commands import run

NETNS_DIR = Path("/run/netns")
SYS_NET = Path("/sys/class/net")
POD_LINK = "eth0"


def netns_path(name: str) -> Path:
    return NETNS_DIR / name


async def create(
    ip: str, *, netns: str, link: str, address: str, gateway: ipaddress.IPv4Address
) -> None:
    """Namespace, veth pair, addresses and routes (three ``ip`` runs)."""
    await run(
        [ip, "-batch", "-"],
        stdin=(
            f"netns add {netns}\n"
            f"link add {link} type veth peer name {POD_LINK} netns {netns}\n"
            f"addr add {gateway}/32 dev {link}\n"
            f"link set {link} up\n"
        ),
    )
    await run(
        [ip, "-n", netns, "-batch", "-"],
        stdin=(
            "link set lo up\n"
            f"addr add {address}/32 dev {POD_LINK}\n"
            f"link set {POD_LINK} up\n"
            f"route add {gateway} dev {POD_LINK} scope link\n"
            f"route add default via {gateway} dev {POD_LINK}\n"
        ),
    )
    # replace: a pod of the same workload being removed may still hold the route a moment.
    await run([ip, "route", "replace", f"{address}/32", "dev", link, "src", str(gateway)])


async def remove(ip: str, *, netns: str, link: str) -> None:
    """Remove whichever of the two exists (deleting the host side deletes the pair at once;
    a namespace is freed by the kernel once no process is left in it)."""
    commands = []
    if (SYS_NET / link).exists():
        commands.append(f"link del {link}\n")
    if netns_path(netns).exists():
        commands.append(f"netns del {netns}\n")
    if commands:
        await run([ip, "-force", "-batch", "-"], stdin="".join(commands), check=False)


def own_links(prefix: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(SYS_NET) if n.startswith(prefix))
    except OSError:
        return []


def own_netns(prefix: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(prefix))
    except OSError:
        return []


async def netns_in_use(ip: str, name: str) -> bool:
    """Whether any process lives in the namespace (unknown counts as in use)."""
    listed = await run([ip, "netns", "pids", name], check=False)
    return listed.returncode != 0 or bool(listed.stdout.strip())
