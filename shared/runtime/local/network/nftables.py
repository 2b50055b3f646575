"""The instance's nftables table: isolation, NAT and each pod's egress policy, as nft scripts.

One table (family ``inet``) per instance, ``torpor_<id>``; its comment records the claimed range
(read back after a restart). Every rule matches only this instance's links (``tp<id>*``):

- ``input``: a pod reaches no address of the host (gateway, host interfaces, loopback
  services); only replies to connections the host opened to the pod pass.
- ``forward``: into a pod only replies to its own connections; from a pod only packets whose
  source is the pod's own address on its own link (``links``), to no other pod, and then the pod's
  egress chain (``egress`` map: link → ``egress_<pod net id>``), which implements
  :meth:`NetworkPolicy.permits` exactly: ``allow_out`` accepts, then the effective deny list
  rejects, everything else is accepted. It sees every packet, so a new policy also cuts open
  connections. Pods have no IPv6 address; IPv6 from a pod is rejected.
- ``postrouting``: pod traffic leaving the host is masqueraded (NAT).

Underneath, the host-wide guard (:mod:`.guard`) rejects the same on its own for every instance's
links, so no pod reaches the host or another pod while this table is replaced, deleted or not
yet made; :func:`table_script` also refreshes the guard and marks the instance live there.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping

from shared.models.network import NetworkPolicy
from shared.runtime.local.network import guard
from shared.runtime.local.network.names import InstanceNames

REJECT = guard.REJECT
_COMMENT = re.compile(r'comment "torpor (\S+) ')
_LABEL = re.compile(r'comment "torpor \S+ ([^"]*)"')
_INSTANCE_TABLE = re.compile(r"^table inet torpor_([0-9a-f]{6})$", flags=re.MULTILINE)


def _v4(cidrs: tuple[str, ...]) -> list[ipaddress.IPv4Network]:
    nets = [ipaddress.ip_network(c) for c in cidrs]
    v4 = [n for n in nets if isinstance(n, ipaddress.IPv4Network)]
    return list(ipaddress.collapse_addresses(v4))


def egress_lists(
    policy: NetworkPolicy,
) -> tuple[list[ipaddress.IPv4Network], list[ipaddress.IPv4Network]]:
    """(accepted, rejected) IPv4 networks, checked in that order, then accept."""
    return _v4(policy.allow_out), _v4(policy.effective_deny)


def permits(policy: NetworkPolicy, address: str) -> bool:
    """What the rendered chain does with ``address`` (tests compare it with the model's rule)."""
    ip = ipaddress.ip_address(address)
    allow, deny = egress_lists(policy)
    if any(ip in n for n in allow):
        return True
    return not any(ip in n for n in deny)


def _set(nets: list[ipaddress.IPv4Network]) -> str:
    return "{ " + ", ".join(str(n) for n in nets) + " }"


def egress_rules(names: InstanceNames, net_id: str, address: str, policy: NetworkPolicy) -> str:
    """Replace one pod's egress chain and (re)register its link and address: one atomic,
    idempotent script (also what a live policy change runs)."""
    table, chain, link = names.table, names.chain(net_id), names.link(net_id)
    allow, deny = egress_lists(policy)
    lines = [f"add chain inet {table} {chain}", f"flush chain inet {table} {chain}"]
    if allow:
        lines.append(f"add rule inet {table} {chain} ip daddr {_set(allow)} accept")
    if deny:
        lines.append(f"add rule inet {table} {chain} ip daddr {_set(deny)} {REJECT}")
    lines += [
        f"add rule inet {table} {chain} accept",
        f'add element inet {table} links {{ "{link}" . {address} }}',
        f'add element inet {table} egress {{ "{link}" : jump {chain} }}',
    ]
    return "\n".join(lines) + "\n"


def remove_pod(names: InstanceNames, net_id: str, address: str) -> str:
    """Remove one pod's rules whether or not they exist (``add`` first makes the deletes always
    valid; nft 1.0.6 has no ``destroy``)."""
    table, chain, link = names.table, names.chain(net_id), names.link(net_id)
    return (
        f"add chain inet {table} {chain}\n"
        f'add element inet {table} links {{ "{link}" . {address} }}\n'
        f'add element inet {table} egress {{ "{link}" : jump {chain} }}\n'
        f'delete element inet {table} egress {{ "{link}" }}\n'
        f'delete element inet {table} links {{ "{link}" . {address} }}\n'
        f"flush chain inet {table} {chain}\n"
        f"delete chain inet {table} {chain}\n"
    )


def table_script(
    names: InstanceNames,
    subnet: ipaddress.IPv4Network,
    label: str,
    pods: Mapping[str, tuple[str, NetworkPolicy]],
    *,
    replace: bool,
) -> str:
    """The guard (made or refreshed, this instance live there) and the whole table with the
    given pods' rules.
    ``replace``: atomically swap out an existing table (the add-then-delete makes the delete valid
    when there is none)."""
    table, links = names.table, names.link_glob
    safe_label = label.replace('"', "").replace("\\", "")[:100]
    head = f"add table inet {table}\ndelete table inet {table}\n" if replace else ""
    base = f"""table inet {table} {{
  comment "torpor {subnet} {safe_label}"
  set links {{ type ifname . ipv4_addr; }}
  map egress {{ type ifname : verdict; }}
  chain pod_source {{
    meta nfproto ipv6 {REJECT}
    iifname . ip saddr != @links {REJECT}
  }}
  chain input {{
    type filter hook input priority filter - 10; policy accept;
    iifname "{links}" jump pod_source
    iifname "{links}" ct state established,related accept
    iifname "{links}" {REJECT}
  }}
  chain from_pod {{
    jump pod_source
    ip daddr {subnet} {REJECT}
    iifname vmap @egress
    {REJECT}
  }}
  chain forward {{
    type filter hook forward priority filter - 10; policy accept;
    oifname "{links}" ct state established,related accept
    oifname "{links}" {REJECT}
    iifname "{links}" jump from_pod
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {subnet} oifname != "{links}" masquerade
  }}
}}
"""
    per_pod = "".join(
        egress_rules(names, net_id, address, policy)
        for net_id, (address, policy) in sorted(pods.items())
    )
    live = guard.script(subnet) + guard.unmark_released(links)
    return live + head + base + per_pod


def subnet_of(listing: str) -> ipaddress.IPv4Network | None:
    """The range recorded in a listed table's comment."""
    match = _COMMENT.search(listing)
    if match is None:
        return None
    try:
        return ipaddress.IPv4Network(match.group(1))
    except ValueError:
        return None


def label_of(listing: str) -> str | None:
    """The data dir recorded in a listed table's comment (cut at 100 characters)."""
    match = _LABEL.search(listing)
    return match.group(1) if match else None


def instances_of(tables: str) -> list[str]:
    """Instance ids of the torpor tables in ``nft list tables``."""
    return _INSTANCE_TABLE.findall(tables)


def chains_of(listing: str) -> list[str]:
    return re.findall(r"^\s*chain (\S+) \{", listing, flags=re.MULTILINE)
