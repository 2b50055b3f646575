"""The local runtime's pod network: a network namespace per pod on a routed veth link, NAT to the
outside, and each sandbox's NetworkPolicy enforced by nftables (see ``podnet``)."""

from shared.runtime.local.network.podnet import PodNetwork, release_instance

__all__ = ["PodNetwork", "release_instance"]
