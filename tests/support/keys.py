"""API keys for a test's users, straight into the bus's key store (``torpor keys create`` has its own
tests; a fixture need not pay a CLI start-up per user)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping

from shared.auth.keys import KvApiKeys, KvUsers
from shared.bus.broker import key_value, make_broker, prepare
from shared.bus.kv import NatsBucket
from shared.bus.topology import KV_API_KEYS, KV_USERS
from shared.settings import BusSettings

# Two tenants and an admin: what most tests need to show one user cannot reach another.
USERS: Mapping[str, bool] = {"alice": False, "bob": False, "root": True}


@contextlib.asynccontextmanager
async def key_store(
    nats: str | BusSettings, *, provision: bool = True, service: str = "test"
) -> AsyncIterator[KvApiKeys]:
    """The key store of the bus at ``nats`` (a URL, or settings with credentials). ``provision``:
    converge the topology first (off when a test provisioned it with its own settings, which
    converging would undo)."""
    bus = nats if isinstance(nats, BusSettings) else BusSettings(nats_url=nats)
    bus = bus.model_copy(update={"bus_provision": provision})
    broker = make_broker(bus, service=service)
    await prepare(broker, bus)
    try:
        users = KvUsers(NatsBucket(await key_value(broker, KV_USERS)))
        yield KvApiKeys(NatsBucket(await key_value(broker, KV_API_KEYS)), users)
    finally:
        await broker.stop()


async def make_keys(
    nats: str | BusSettings, users: Mapping[str, bool] = USERS, *, provision: bool = True
) -> dict[str, str]:
    """user → a new API key (``users`` maps each name to whether it is an admin)."""
    async with key_store(nats, provision=provision) as keys:
        return {name: (await keys.create(name, admin=admin))[1] for name, admin in users.items()}
