"""Which private IPv4 range an instance's pods use, checked against the host's own routes.

``TORPOR_POD_CIDR=auto`` (the default) takes the first /20 of ``10.224.0.0/12`` that overlaps
no route or address of the host; an explicit CIDR is used as given, or refused with one line when
it overlaps. The claim itself is an ``unreachable`` route for the range, added by the instance:
the kernel refuses a second identical route, so two instances starting at once never get the
same range, and traffic for a stopped pod's address ends at the host instead of leaving through
the default route.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Iterator

from shared.errors import ConfigError

AUTO = "auto"
POOL = ipaddress.IPv4Network("10.224.0.0/12")
AUTO_PREFIX = 20
MIN_PREFIX, MAX_PREFIX = 16, 28


def parse_setting(value: str) -> ipaddress.IPv4Network | None:
    """``None`` for ``auto``; otherwise a private IPv4 network of /16../28, or ConfigError."""
    if value.strip().lower() == AUTO:
        return None
    try:
        net = ipaddress.ip_network(value.strip(), strict=True)
    except ValueError:
        msg = f"TORPOR_POD_CIDR must be 'auto' or an IPv4 network like 10.224.0.0/20, got {value!r}"
        raise ConfigError(msg) from None
    if not isinstance(net, ipaddress.IPv4Network):
        msg = f"TORPOR_POD_CIDR must be an IPv4 network, got {value!r}"
        raise ConfigError(msg)
    if not net.is_private or net.is_loopback or net.is_link_local or net.is_multicast:
        msg = f"TORPOR_POD_CIDR {net} is not a private range (use 10/8, 172.16/12 or 192.168/16)"
        raise ConfigError(msg)
    if not MIN_PREFIX <= net.prefixlen <= MAX_PREFIX:
        msg = f"TORPOR_POD_CIDR {net} must be between /{MIN_PREFIX} and /{MAX_PREFIX}"
        raise ConfigError(msg)
    return net


def host_networks(routes_json: str, addresses_json: str) -> list[ipaddress.IPv4Network]:
    """Every IPv4 destination the host routes (in any table) and every address's network,
    from ``ip -j -4 route show table all`` and ``ip -j -4 addr show``; the default route is
    not a claim on any range."""
    out: list[ipaddress.IPv4Network] = []
    for route in json.loads(routes_json or "[]"):
        dst = route.get("dst", "")
        if dst in {"", "default", "0.0.0.0/0"}:
            continue
        try:
            out.append(ipaddress.IPv4Network(dst, strict=False))
        except ValueError:
            continue
    for link in json.loads(addresses_json or "[]"):
        for info in link.get("addr_info", []):
            try:
                out.append(
                    ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False)
                )
            except (KeyError, ValueError):
                continue
    return out


def overlap(
    candidate: ipaddress.IPv4Network, taken: Iterable[ipaddress.IPv4Network]
) -> ipaddress.IPv4Network | None:
    return next((t for t in taken if t.overlaps(candidate)), None)


def candidates(setting: ipaddress.IPv4Network | None) -> Iterator[ipaddress.IPv4Network]:
    if setting is not None:
        yield setting
        return
    yield from POOL.subnets(new_prefix=AUTO_PREFIX)
