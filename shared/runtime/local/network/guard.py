"""The host's guard table: what no pod of any torpor instance may do, enforced whichever instance
owns the pod's link and whether or not that instance's own table (:mod:`.nftables`) exists.

One table, ``inet torpor_guard``, shared by every instance on the host: each creates it (an
idempotent, atomic script) when it opens its network or rebuilds its table, none deletes it. Why
a second table: an instance's table matches only its own links and is replaced or deleted by that
instance, so a pod whose link matched no live table (its instance released the network while a
pool refill still made pods) was under no rule at all, and a pod gateway that stopped being local
between two packets (another instance's last pod went, its range released) was forwarded like
any outside address, to whatever answers there. In nftables a drop or reject in any base chain is
final and an accept is not: the guard only rejects, so no other table can undo it, and it runs
before the instances' chains (a lower priority number).

- ``prerouting``: a packet from a pod link to an address of the host that is not in a pod range
  (the gateway is; eth0's, another link's, 127/8 are not) is refused before connection tracking,
  NAT and routing see it: whatever state, translation or route the host holds, no pod reaches a
  host address other than its gateway. The host opens its connections to pods from the gateway
  (the pod routes' ``src``), so replies never need another.
- ``prerouting``, too, on the packet alone (no connection state): to any address of the host
  (a gateway included), a pod never opens a TCP connection (a SYN without ACK), sends no
  datagram nor any other protocol, and of ICMP only replies and errors. Connection tracking
  can be wrong about a pod's flow (a stale entry of its address's previous pod, a helper's
  expectation, an entry another tool made: ``conntrack -I`` in the test), and the ``input``
  rule below trusts it; these rules do not, so no state of the host's opens the host to a pod.
- ``input``: from any pod link, only replies to connections the host opened pass.
- ``forward``: into any pod link only replies; from a pod link only IPv4 from a pod range, and
  never to a pod range (``ranges``: the automatic pool and every range an instance claimed here;
  kept until reboot, so an address that just stopped being local stays unreachable).
- ``released``: the links of an instance that released its network (marked in the transaction
  that deletes its table, unmarked when it opens again) pass nothing at all, so a pod that a
  still-running process of that instance makes afterwards (a pool refill) is closed, not open.

The guard never requires a pod to be registered anywhere: instances of an older torpor on the
same host, whose tables never registered their pods, keep working under it.

Every pod link is ``tp`` + 6 hex digits (:mod:`.names`); the set ``pod_links`` of 16 globs matches
those and nothing else starting with ``tp`` (the Kubernetes test rig's bridge is ``tpr…``). It is a
named set: nft 1.0.6 merges adjacent globs of an anonymous set into a range it then lists as
garbage (a listing that no longer loads).
"""

from __future__ import annotations

import ipaddress

from shared.runtime.local.network.names import ALL_LINK_GLOBS
from shared.runtime.local.network.subnet import POOL

TABLE = "torpor_guard"
REJECT = "reject with icmpx admin-prohibited"
PRIORITY = "filter - 20"  # before every instance's chains (filter - 10)
_T = f"inet {TABLE}"
_GLOBS = ", ".join(f'"{g}"' for g in ALL_LINK_GLOBS)
_REPLIES = "ct state != { established, related }"
# Every address of the host's, the pod gateways included (and what it takes in as broadcast or
# multicast): what a pod may send there is decided on the packet alone, not on connection state.
_TO_HOST = "fib daddr type { local, broadcast, multicast }"
_ICMP_NOT_REPLY = (
    "meta l4proto icmp icmp type != "
    "{ echo-reply, destination-unreachable, time-exceeded, parameter-problem }"
)


def script(subnet: ipaddress.IPv4Network) -> str:
    """Create or refresh the guard and add ``subnet`` to its ranges: one atomic transaction (the
    chains are flushed and refilled in it, so no packet ever sees them empty)."""
    return f"""add table {_T} {{ comment "torpor: every instance's pods; shared, never deleted"; }}
add set {_T} pod_links {{ type ifname; flags interval; }}
add set {_T} released {{ type ifname; flags interval; }}
add set {_T} ranges {{ type ipv4_addr; flags interval; auto-merge; }}
add chain {_T} prerouting {{ type filter hook prerouting priority raw; policy accept; }}
add chain {_T} input {{ type filter hook input priority {PRIORITY}; policy accept; }}
add chain {_T} forward {{ type filter hook forward priority {PRIORITY}; policy accept; }}
add chain {_T} from_pod
flush chain {_T} prerouting
flush chain {_T} input
flush chain {_T} forward
flush chain {_T} from_pod
add element {_T} pod_links {{ {_GLOBS} }}
add rule {_T} prerouting iifname @pod_links fib daddr type local ip daddr != @ranges {REJECT}
add rule {_T} prerouting iifname @pod_links meta nfproto ipv6 fib daddr type local {REJECT}
add rule {_T} prerouting iifname @pod_links {_TO_HOST} tcp flags & (syn | ack) == syn {REJECT}
add rule {_T} prerouting iifname @pod_links {_TO_HOST} meta l4proto != {{ tcp, icmp }} {REJECT}
add rule {_T} prerouting iifname @pod_links {_TO_HOST} {_ICMP_NOT_REPLY} {REJECT}
add rule {_T} input iifname @released {REJECT}
add rule {_T} input iifname @pod_links {_REPLIES} {REJECT}
add rule {_T} forward iifname @released {REJECT}
add rule {_T} forward oifname @released {REJECT}
add rule {_T} forward oifname @pod_links {_REPLIES} {REJECT}
add rule {_T} forward iifname @pod_links jump from_pod
add rule {_T} from_pod meta nfproto ipv6 {REJECT}
add rule {_T} from_pod ip saddr != @ranges {REJECT}
add rule {_T} from_pod ip daddr @ranges {REJECT}
add element {_T} ranges {{ {POOL}, {subnet} }}
"""


def mark_released(link_glob: str) -> str:
    """Every link of the instance (``tp<id>*``) passes nothing from now on."""
    return f'add element {_T} released {{ "{link_glob}" }}\n'


def unmark_released(link_glob: str) -> str:
    """The instance is live again (``add`` first makes the delete always valid)."""
    return mark_released(link_glob) + f'delete element {_T} released {{ "{link_glob}" }}\n'
