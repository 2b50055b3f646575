"""The provisioning Job (provision-job.yaml): create or converge torpor's streams, KV buckets and
durable consumers with the NATS ``admin`` user, and import the bootstrap API key.

Why a Job: the services' NATS users are least-privilege and may not create streams or
consumers, so the services run with ``TORPOR_BUS_PROVISION=false`` and this Job (re-run on every
``kubectl apply``: its name carries the config hash) owns the topology. It runs in the
control-plane image and uses the very same ``ensure_topology`` as ``torpor up``.

Environment: ``NATS_URL``, ``NATS_USER`` + ``NATS_PASSWORD`` (the admin user),
``TORPOR_BUS_REPLICAS`` (1 dev, 3 production), optional ``TORPOR_BOOTSTRAP_USER`` +
``TORPOR_BOOTSTRAP_API_KEY`` (Secret ``torpor-api-keys``): the first admin user and a key for
it, stored hashed; re-running keeps an existing key.
"""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import UTC, datetime

import nats
from nats.js.errors import KeyWrongLastSequenceError

from shared.auth.keys import KvUsers, hash_secret
from shared.auth.models import ApiKeyRecord
from shared.bus.broker import connect_options
from shared.bus.kv import NatsBucket
from shared.bus.topology import KV_API_KEYS, KV_USERS, ensure_topology
from shared.settings import BusSettings, load


async def provision() -> None:
    bus = load(BusSettings)
    options: dict[str, object] = {
        "name": "torpor-provision",
        "max_reconnect_attempts": 30,
        **connect_options(bus),
    }
    nc = await nats.connect(bus.nats_url.split(","), **options)
    try:
        js = nc.jetstream()
        await ensure_topology(
            js, replicas=bus.bus_replicas, kept_files_max_bytes=bus.kept_files_max_bytes
        )
        print(f"topology converged (replicas={bus.bus_replicas})", flush=True)
        user = os.environ.get("TORPOR_BOOTSTRAP_USER", "").strip()
        secret = os.environ.get("TORPOR_BOOTSTRAP_API_KEY", "").strip()
        if user and secret:
            await KvUsers(NatsBucket(await js.key_value(KV_USERS))).ensure(user, admin=True)
            record = ApiKeyRecord(key_id="key_bootstrap", user=user, created_at=datetime.now(UTC))
            keys = await js.key_value(KV_API_KEYS)
            try:
                await keys.create(hash_secret(secret), record.model_dump_json().encode())
                print(f"bootstrap API key stored for {user}", flush=True)
            except KeyWrongLastSequenceError:
                print(f"bootstrap API key for {user} already present", flush=True)
    finally:
        await nc.close()


def main() -> int:
    try:
        asyncio.run(provision())
    except Exception as e:
        print(f"provisioning failed: {e!r}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
