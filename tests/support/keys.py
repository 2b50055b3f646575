"""API keys for a test's users: straight into the bus's key store, or through ``torpor keys``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from shared.auth.keys import KvApiKeys, KvUsers
from shared.bus.broker import key_value, make_broker, prepare
from shared.bus.kv import NatsBucket
from shared.bus.topology import KV_API_KEYS, KV_USERS
from shared.settings import BusSettings
from tests.support.env import cli_env, torpor

# Two tenants and an admin: what most tests need to show one user cannot reach another.
USERS: Mapping[str, bool] = {"alice": False, "bob": False, "root": True}


@contextlib.asynccontextmanager
async def key_store(
    nats_url: str, *, provision: bool = True, service: str = "test"
) -> AsyncIterator[KvApiKeys]:
    """The key store of the bus at ``nats_url``. ``provision``: converge the topology first
    (off when a test provisioned it with its own settings, which converging would undo)."""
    bus = BusSettings(nats_url=nats_url, bus_provision=provision)
    broker = make_broker(bus, service=service)
    await prepare(broker, bus)
    try:
        users = KvUsers(NatsBucket(await key_value(broker, KV_USERS)))
        yield KvApiKeys(NatsBucket(await key_value(broker, KV_API_KEYS)), users)
    finally:
        await broker.stop()


async def make_keys(
    nats_url: str, users: Mapping[str, bool] = USERS, *, provision: bool = True
) -> dict[str, str]:
    """user → a new API key (``users`` maps each name to whether it is an admin)."""
    async with key_store(nats_url, provision=provision) as keys:
        return {name: (await keys.create(name, admin=admin))[1] for name, admin in users.items()}


def cli_key(data_dir: Path, user: str, *, admin: bool = False) -> str:
    """A key made the way an operator makes one: ``torpor keys create`` on a ``torpor up``."""
    args = ["keys", "create", user, "--data-dir", str(data_dir)]
    done = torpor(*args, *(["--admin"] if admin else []), env=cli_env())
    if done.returncode != 0:
        # Not a start-up failure (those skip off CI): a broken key command is a defect.
        msg = f"torpor keys create {user} failed: {done.stderr.strip()[-300:]}"
        raise AssertionError(msg)
    return done.stdout.strip()
