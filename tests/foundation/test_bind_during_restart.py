"""A service binds its buckets as it starts; a NATS restart at that moment must delay the start,
not end it (CI: the API exited with 3 when a fault run restarted NATS during its start-up)."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.errors import BucketNotFoundError
from structlog.testing import capture_logs

from shared.bus.broker import key_value, make_broker, prepare
from shared.bus.server import EmbeddedNats
from shared.bus.topology import KV_USERS
from shared.settings import BusSettings


async def test_a_bucket_bound_while_the_bus_restarts_is_bound_once_it_is_back(
    fresh_nats: EmbeddedNats,
) -> None:
    bus = BusSettings(nats_url=fresh_nats.url)
    broker = make_broker(bus, service="bind-test")
    await prepare(broker, bus)  # provisions the buckets
    try:
        await asyncio.to_thread(fresh_nats.stop)
        binding = asyncio.create_task(key_value(broker, KV_USERS))
        await asyncio.sleep(7)  # past one JetStream request's 5 s timeout
        assert not binding.done(), binding  # still asking, not failed
        await asyncio.to_thread(fresh_nats.start)
        kv = await asyncio.wait_for(binding, 60)
        await kv.put("probe", b"1")
        assert (await kv.get("probe")).value == b"1"
    finally:
        await broker.stop()


async def test_a_missing_bucket_fails_at_once(fresh_nats: EmbeddedNats) -> None:
    bus = BusSettings(nats_url=fresh_nats.url, bus_provision=False)
    broker = make_broker(bus, service="bind-test")
    await prepare(broker, bus)
    try:
        with capture_logs() as logs, pytest.raises(BucketNotFoundError):
            await key_value(broker, "no-such-bucket")
        assert not [e for e in logs if e["event"] == "bus_no_answer_retry"]  # not asked again
    finally:
        await broker.stop()
