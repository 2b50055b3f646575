"""Names of one runtime instance's network objects, derived from its data dir.

Every host object the pod network creates carries the instance's id (6 hex digits of the data
dir's hash), so two runtimes on one host never touch each other's objects, and a sweep after a
``kill -9`` removes only names that match these patterns exactly: objects it created.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

MAX_SLOTS = 0xFFFF  # addresses per range (a /16 at most)
_POD = re.compile(r"[0-9a-f]{7}")
LINK_PREFIX = "tp"  # + the instance's 6 hex digits + the pod's 7: the host side of a pod link
# Every pod link of every instance, and nothing else starting with "tp", as nft globs.
ALL_LINK_GLOBS = tuple(f"{LINK_PREFIX}{digit}*" for digit in "0123456789abcdef")


def pod_net_id(pod_uid: str) -> str:
    """The 7 hex digits that name one pod's network objects (from its random uid): each pod has
    its own, so removing one pod's network never touches another's, even one of the same
    workload starting meanwhile."""
    net_id = pod_uid.replace("-", "")[:7].lower()
    if not _POD.fullmatch(net_id):
        msg = f"pod uid {pod_uid[:40]!r} does not start with 7 hex digits"
        raise ValueError(msg)
    return net_id


@dataclass(frozen=True)
class InstanceNames:
    instance: str  # 6 hex digits

    @classmethod
    def for_data_dir(cls, data_dir: Path) -> InstanceNames:
        digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()
        return cls(instance=digest[:6])

    @property
    def table(self) -> str:
        """The nftables table (family ``inet``) holding all of the instance's rules."""
        return f"torpor_{self.instance}"

    @property
    def link_prefix(self) -> str:
        return f"{LINK_PREFIX}{self.instance}"

    @property
    def link_glob(self) -> str:
        """Matches every host-side pod link of this instance in an nft rule."""
        return f"{self.link_prefix}*"

    @property
    def netns_prefix(self) -> str:
        return f"torpor-{self.instance}-"

    def link(self, net_id: str) -> str:
        """The host side of the pod's veth pair (15 characters, Linux's limit)."""
        return f"{self.link_prefix}{_checked(net_id)}"

    def netns(self, net_id: str) -> str:
        return f"{self.netns_prefix}{_checked(net_id)}"

    def chain(self, net_id: str) -> str:
        return f"egress_{_checked(net_id)}"

    def id_of_link(self, name: str) -> str | None:
        return _suffix(name, self.link_prefix)

    def id_of_netns(self, name: str) -> str | None:
        return _suffix(name, self.netns_prefix)

    def id_of_chain(self, name: str) -> str | None:
        return _suffix(name, "egress_")


def _checked(net_id: str) -> str:
    if not _POD.fullmatch(net_id):
        msg = f"not a pod network id: {net_id[:40]!r}"
        raise ValueError(msg)
    return net_id


def _suffix(name: str, prefix: str) -> str | None:
    rest = name.removeprefix(prefix)
    return rest if rest != name and _POD.fullmatch(rest) else None
