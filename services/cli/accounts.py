"""Opening the users/API-keys stores over NATS for ``torpor keys`` and ``torpor up``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from services.cli.instance import ADMIN_KEY_FILE, ADMIN_USER, read_admin_key, write_private
from shared.auth.keys import KvApiKeys, KvUsers
from shared.bus.broker import key_value, make_broker, prepare, redact_url
from shared.bus.kv import NatsBucket
from shared.bus.topology import KV_API_KEYS, KV_USERS, ensure_workloads_bucket
from shared.errors import ConfigError
from shared.settings import BusSettings


@contextlib.asynccontextmanager
async def open_accounts(
    bus: BusSettings, *, connect_within: float = 10.0, local_runtime: bool = False
) -> AsyncIterator[tuple[KvApiKeys, KvUsers]]:
    """``local_runtime``: also provision the local runtime's bucket (``torpor up``: its services'
    users may not create it)."""
    broker = make_broker(bus, service="cli")
    try:
        try:
            await asyncio.wait_for(prepare(broker, bus), connect_within)
        except (TimeoutError, OSError) as e:
            msg = f"cannot reach NATS at {redact_url(bus.nats_url)} ({type(e).__name__})"
            raise ConfigError(msg) from None
        if local_runtime:
            await ensure_workloads_bucket(broker.config.connection_state.stream)
        users = KvUsers(NatsBucket(await key_value(broker, KV_USERS)))
        keys = KvApiKeys(NatsBucket(await key_value(broker, KV_API_KEYS)), users)
        yield keys, users
    finally:
        with contextlib.suppress(Exception):
            await broker.stop()


async def ensure_admin_key(keys: KvApiKeys, data_dir: Path) -> str:
    """The first user's key, kept in the data dir (0600); issued anew if missing or revoked."""
    existing = read_admin_key(data_dir)
    if existing is not None and await keys.authenticate(existing) is not None:
        return existing
    _, secret = await keys.create(ADMIN_USER, admin=True)
    write_private(data_dir / ADMIN_KEY_FILE, secret + "\n")
    return secret
