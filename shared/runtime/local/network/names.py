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

MAX_SLOTS = 0xFFFF  # four hex digits in a link name (Linux allows 15 characters)


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
        return f"tp{self.instance}"

    @property
    def link_glob(self) -> str:
        """Matches every host-side pod link of this instance in an nft rule."""
        return f"{self.link_prefix}*"

    def link(self, slot: int) -> str:
        """The host side of slot ``slot``'s veth pair (12 characters)."""
        _check_slot(slot)
        return f"{self.link_prefix}{slot:04x}"

    def netns(self, slot: int) -> str:
        _check_slot(slot)
        return f"torpor-{self.instance}-{slot:04x}"

    def chain(self, slot: int) -> str:
        _check_slot(slot)
        return f"egress_{slot:04x}"

    def slot_of_link(self, name: str) -> int | None:
        match = re.fullmatch(rf"{self.link_prefix}([0-9a-f]{{4}})", name)
        return int(match.group(1), 16) if match else None

    def slot_of_netns(self, name: str) -> int | None:
        match = re.fullmatch(rf"torpor-{self.instance}-([0-9a-f]{{4}})", name)
        return int(match.group(1), 16) if match else None

    def slot_of_chain(self, name: str) -> int | None:
        match = re.fullmatch(r"egress_([0-9a-f]{4})", name)
        return int(match.group(1), 16) if match else None


def _check_slot(slot: int) -> None:
    if not 0 < slot <= MAX_SLOTS:
        msg = f"pod slot {slot} out of range"
        raise ValueError(msg)
