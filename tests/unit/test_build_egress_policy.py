"""The build pods' egress policy (``shared.models.network.public_only``) and its setting
(``TORPOR_BUILDER_EGRESS_ALLOW``): pure rules, no traffic (the probe from inside a build step is
tests/templates/test_build_egress.py)."""

from __future__ import annotations

import ipaddress

import pytest
from pydantic import ValidationError

from services.builder.settings import BuilderSettings
from shared.models.network import NOT_PUBLIC, public_only
from shared.runtime.kubernetes.objects import egress_rules
from shared.runtime.local.network import nftables

NOT_REACHABLE = [
    "10.1.2.3",
    "172.20.0.1",
    "192.168.1.1",
    "169.254.169.254",  # cloud metadata
    "100.100.100.200",  # a cloud's metadata, in the shared range
    "127.0.0.1",
    "0.0.0.1",
    "192.0.2.2",
    "198.18.0.5",
    "224.0.0.251",
    "255.255.255.255",
]
PUBLIC = ["8.8.8.8", "151.101.0.223", "1.1.1.1"]


@pytest.mark.parametrize("allow_internet", [True, False])
def test_never_the_operators_networks_unless_allow_listed(allow_internet: bool) -> None:
    policy = public_only(allow_internet=allow_internet, allow_out=("10.0.5.10/32",))
    for address in NOT_REACHABLE:
        assert not policy.permits(address), address
    for address in PUBLIC:
        assert policy.permits(address) is allow_internet, address
    assert policy.permits("10.0.5.10")  # the allow-listed mirror, private or not
    assert not policy.permits("10.0.5.11")
    for address in [*NOT_REACHABLE, *PUBLIC, "10.0.5.10", "10.0.5.11"]:
        # What the local runtime's chain does, and what a Kubernetes NetworkPolicy may say.
        assert nftables.permits(policy, address) == policy.permits(address), address
    for rule in egress_rules(policy):
        for peer in rule.get("to", []):
            block = peer["ipBlock"]
            outer = ipaddress.ip_network(block["cidr"])
            for inner in block.get("except", []):
                assert ipaddress.ip_network(inner).subnet_of(outer)  # type: ignore[arg-type]


def test_not_public_is_what_the_standard_library_calls_not_global() -> None:
    for cidr in NOT_PUBLIC:  # (the stdlib calls multicast global: no unicast host, denied)
        first = ipaddress.ip_network(cidr).network_address
        assert not first.is_global or first.is_multicast or cidr == "::/0", cidr
    for address in NOT_REACHABLE:
        ip = ipaddress.ip_address(address)
        assert not ip.is_global or ip.is_multicast


def test_the_allow_list_setting() -> None:
    settings = BuilderSettings(egress_allow=" 10.0.5.10, 10.0.6.0/24,10.0.5.10/32 ")
    assert settings.egress_allow_list == ("10.0.5.10/32", "10.0.6.0/24")
    assert BuilderSettings().egress_allow_list == ()


@pytest.mark.parametrize(
    "hostile",
    [
        "--ro-bind",
        "10.0.0.1\x00",
        "mirror.example.com",
        "::1",
        "fd00::/8",
        "10.0.0.1;rm -rf /",
        "10.0.0.0/33",
        ",".join(f"10.0.{i // 256}.{i % 256}" for i in range(300)),
        "x" * 20000,
    ],
)
def test_a_hostile_allow_list_is_a_configuration_error(hostile: str) -> None:
    with pytest.raises(ValidationError) as refused:
        BuilderSettings(egress_allow=hostile)
    assert "egress_allow" in str(refused.value)
