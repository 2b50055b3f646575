"""Each workload's pod address: reserved in the workloads' KV bucket for the workload's lifetime.

Today an address is a loopback address (127.0.x.y) the pod's daemon listens on; key
``addr.<a>-<b>-<c>-<d>`` holds ``{"workload": name}``. The pool's interface (reserve, release,
release_orphans) is all the rest of the runtime uses, so the allocation scheme can change here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from shared.bus.kv import key_names
from shared.errors import RuntimeFailure
from shared.runtime.models import ENVD_PORT

ADDRESS_PREFIX = "addr."


def address_key(address: str) -> str:
    return ADDRESS_PREFIX + address.replace(".", "-")


class AddressPool:
    def __init__(self, kv: KeyValue, *, first_address: str = "127.0.0.2") -> None:
        self._kv = kv
        self._first = tuple(int(p) for p in first_address.split("."))

    async def reserve(self, name: str) -> str:
        """A free address, now reserved for workload ``name``."""
        a, b, c, d = self._first
        taken = set(await self.reserved())
        for third in range(c, 256):
            for fourth in range(d if third == c else 2, 255):
                address = f"{a}.{b}.{third}.{fourth}"
                if address in taken or await _port_open(address, ENVD_PORT):
                    continue
                if await self._claim(address, name):
                    return address
        msg = "no free loopback address left for a local pod"
        raise RuntimeFailure(msg)

    async def release(self, address: str) -> None:
        try:
            await self._kv.purge(address_key(address))
        except KeyNotFoundError:
            return

    async def release_orphans(self, names: set[str]) -> None:
        """Release addresses held by workloads not in ``names`` (e.g. deleted while down)."""
        for address in await self.reserved():
            holder = await self.holder(address)
            if holder is not None and holder not in names:
                await self.release(address)

    async def holder(self, address: str) -> str | None:
        try:
            entry = await self._kv.get(address_key(address))
        except KeyNotFoundError:
            return None
        if entry.value is None:
            return None
        holder = json.loads(entry.value).get("workload")
        return holder if isinstance(holder, str) else None

    async def reserved(self) -> list[str]:
        # Not ``KeyValue.keys()``: it can miss keys under load (see records.WorkloadStore).
        keys = await key_names(self._kv)
        addresses = [
            k.removeprefix(ADDRESS_PREFIX).replace("-", ".")
            for k in sorted(keys)
            if k.startswith(ADDRESS_PREFIX)
        ]
        return [a for a in addresses if await self.holder(a) is not None]

    async def _claim(self, address: str, name: str) -> bool:
        try:
            await self._kv.create(address_key(address), json.dumps({"workload": name}).encode())
        except KeyWrongLastSequenceError:
            return False
        return True


async def _port_open(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=0.5)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True
