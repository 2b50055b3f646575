"""Each workload's pod address: reserved in the workloads' KV bucket for the workload's lifetime.

An address is one of the instance's pod range (:mod:`.network`), the address of the pod's own
network namespace, where its daemon listens; key ``addr.<a>-<b>-<c>-<d>`` holds a
:class:`.records.Reservation` (the workload's name, and when). It stays reserved while the
workload is paused, so no other pod can take it over.
"""

from __future__ import annotations

import time

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from shared.bus.kv import key_names
from shared.errors import RuntimeFailure
from shared.runtime.local.network import PodNetwork
from shared.runtime.local.records import reservation_holder, reservation_of, reservation_value

ADDRESS_PREFIX = "addr."


def address_key(address: str) -> str:
    return ADDRESS_PREFIX + address.replace(".", "-")


class AddressPool:
    def __init__(self, kv: KeyValue, *, network: PodNetwork) -> None:
        self._kv = kv
        self._network = network

    def usable(self, address: str) -> bool:
        """Whether ``address`` is a pod address of the current range (a range claimed anew
        after a reboot, or a record from before pod networks, needs a new one)."""
        return self._network.slot_of(address) is not None

    async def reserve(self, name: str) -> str:
        """A free address, now reserved for workload ``name``."""
        taken = set(await self.reserved())
        for slot in self._network.slots():
            address = self._network.address(slot)
            if address not in taken and await self._claim(address, name):
                return address
        msg = f"no free pod address left in {self._network.subnet}"
        raise RuntimeFailure(msg)

    async def release(self, address: str) -> None:
        try:
            await self._kv.purge(address_key(address))
        except KeyNotFoundError:
            return

    async def transfer(self, address: str, name: str) -> None:
        """Workload ``name`` holds ``address`` now (a warm pod claimed with its address)."""
        await self._kv.put(address_key(address), reservation_value(name))

    async def release_held(self, address: str, name: str) -> None:
        """Release ``address`` only while ``name`` holds it (safe to repeat after a crash)."""
        if await self.holder(address) == name:
            await self.release(address)

    async def release_orphans(self, names: set[str]) -> None:
        """Release addresses left over by workloads not in ``names`` (e.g. deleted while down);
        never one reserved a moment ago by a create under way in another process."""
        now = time.time()
        for address in await self._candidates():
            reservation = await reservation_of(self._kv, address_key(address))
            if reservation is not None and reservation.is_left_over(names, now):
                await self.release(address)

    async def holder(self, address: str) -> str | None:
        return await reservation_holder(self._kv, address_key(address))

    async def reserved(self) -> list[str]:
        # Not ``KeyValue.keys()``: it can miss keys under load (see records.WorkloadStore).
        return [a for a in await self._candidates() if await self.holder(a) is not None]

    async def _candidates(self) -> list[str]:
        """Addresses with a key (some may be purged tombstones)."""
        keys = await key_names(self._kv)
        return [
            k.removeprefix(ADDRESS_PREFIX).replace("-", ".")
            for k in sorted(keys)
            if k.startswith(ADDRESS_PREFIX)
        ]

    async def _claim(self, address: str, name: str) -> bool:
        try:
            await self._kv.create(address_key(address), reservation_value(name))
        except KeyWrongLastSequenceError:
            return False
        return True
