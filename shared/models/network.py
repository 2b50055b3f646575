"""A sandbox's network policy: what its code may reach, and who may reach its ports.

One pure model, read by the API (validation), stored on the sandbox record, carried to the
runtime in :class:`shared.ports.workloads.WorkloadSpec` and enforced there (nftables on the local
runtime, a NetworkPolicy on Kubernetes). E2B's rules, in order:

- ``allow_out`` wins over ``deny_out`` (an address in both is allowed);
- ``allow_internet=False`` is ``deny_out=["0.0.0.0/0"]``;
- everything not denied is allowed.

Only IPv4/IPv6 addresses and CIDRs are accepted: domain names cannot be enforced by an IP
filter, so the API refuses them with a 400 naming the field instead of silently ignoring them.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

ALL_TRAFFIC = "0.0.0.0/0"
MAX_RULES = 256

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def normalize_cidr(value: str) -> str:
    """``"10.1.2.3"`` → ``"10.1.2.3/32"``; host bits are cleared; anything else is a ValueError."""
    if not isinstance(value, str) or not value or len(value) > 64 or "\0" in value:
        msg = "must be an IP address or CIDR"
        raise ValueError(msg)
    try:
        return str(ipaddress.ip_network(value.strip(), strict=False))
    except ValueError:
        msg = f"{value[:64]!r} is not an IP address or CIDR (domain names are not supported)"
        raise ValueError(msg) from None


Cidr = Annotated[str, AfterValidator(normalize_cidr)]


class NetworkPolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    allow_internet: bool = True
    allow_out: tuple[Cidr, ...] = Field(default=(), max_length=MAX_RULES)
    deny_out: tuple[Cidr, ...] = Field(default=(), max_length=MAX_RULES)
    # False: the sandbox's user ports need its traffic access token at the proxy.
    allow_public_traffic: bool = True

    @property
    def effective_deny(self) -> tuple[str, ...]:
        """``deny_out``, with ``0.0.0.0/0`` (and ``::/0``) added when internet access is off."""
        if self.allow_internet:
            return self.deny_out
        extra = [c for c in (ALL_TRAFFIC, "::/0") if c not in self.deny_out]
        return (*self.deny_out, *extra)

    def permits(self, address: str) -> bool:
        """Whether sandbox code may open a connection to ``address`` (the rule every adapter
        must implement exactly; tests compare adapters against it)."""
        ip = ipaddress.ip_address(address)
        if any(ip in ipaddress.ip_network(c) for c in self.allow_out):
            return True
        return not any(ip in ipaddress.ip_network(c) for c in self.effective_deny)


OPEN = NetworkPolicy()

# Not the public internet (IANA's special-purpose registry): "this" network, private, shared
# (CGNAT; some clouds' metadata), loopback, link-local (cloud metadata, 169.254.169.254), IETF
# protocol assignments, documentation, benchmarking, multicast, reserved and broadcast.
NOT_PUBLIC: tuple[str, ...] = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/0",  # no IPv6 at all: pods have none, and a v6 allow-list is not offered
)


def public_only(*, allow_internet: bool, allow_out: tuple[str, ...] = ()) -> NetworkPolicy:
    """The public internet (when allowed) and ``allow_out`` (an operator's package mirrors,
    private ones included), never the operator's own networks or cloud metadata: what build
    pods get. The host and other pods are out of reach of every pod anyway (the runtime's
    isolation, whatever the policy)."""
    return NetworkPolicy(allow_internet=allow_internet, allow_out=allow_out, deny_out=NOT_PUBLIC)
