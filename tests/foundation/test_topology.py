"""The topology is created idempotently and nothing (a second call, FastStream binding with
``declare=False``) drifts the stream, KV or consumer configs."""

from __future__ import annotations

import asyncio
from typing import Any

import nats

from shared.bus.broker import make_broker, prepare, subscriber_args
from shared.bus.server import EmbeddedNats
from shared.bus.topology import (
    DURABLES,
    KV_API_KEYS,
    KV_SANDBOXES,
    KV_USERS,
    ensure_topology,
    streams,
)
from shared.settings import BusSettings

KV_STREAMS = [f"KV_{b}" for b in (KV_SANDBOXES, KV_USERS, KV_API_KEYS)]
STREAMS = [cfg.name for cfg in streams(1)] + KV_STREAMS


async def _snapshot(js: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in STREAMS:
        info = await js.stream_info(name)
        out[f"stream:{name}"] = info.config.as_dict()
    for d in DURABLES:
        info = await js.consumer_info(d.stream, d.name)
        cfg = info.config.as_dict()
        out[f"consumer:{d.stream}/{d.name}"] = cfg
    return out


async def test_topology_twice_without_drift(fresh_nats: EmbeddedNats) -> None:
    nc = await nats.connect(fresh_nats.url)
    try:
        js = nc.jetstream()
        await ensure_topology(js)
        first = await _snapshot(js)
        await ensure_topology(js)
        second = await _snapshot(js)
        assert first == second
        # Our settings are really in force (not server defaults).
        assert first["stream:SANDBOX_CMD"]["retention"] == "workqueue"
        assert first["stream:SANDBOX_TIMERS"]["allow_msg_schedules"] is True
        pause = first["consumer:SANDBOX_CMD/snapshotter-pause"]
        assert pause["ack_policy"] == "explicit"
        assert pause["max_deliver"] == 12

        # A FastStream service binding every durable with declare=False changes nothing.
        bus = BusSettings(nats_url=fresh_nats.url)
        broker = make_broker(bus, service="drift-test")
        for durable in DURABLES:

            async def handler(body: Any) -> None:
                del body

            broker.subscriber(**subscriber_args(durable, max_workers=1))(handler)
        await prepare(broker, bus)
        await broker.start()
        await asyncio.sleep(0.5)
        third = await _snapshot(js)
        await broker.stop()
        assert third == first
    finally:
        await nc.close()


async def test_drifted_stream_converges_back(fresh_nats: EmbeddedNats) -> None:
    nc = await nats.connect(fresh_nats.url)
    try:
        js = nc.jetstream()
        await ensure_topology(js)
        before = await _snapshot(js)
        info = await js.stream_info("SANDBOX_EVT")
        cfg = info.config
        cfg.max_age = 3600.0
        await js.update_stream(cfg)
        assert (await js.stream_info("SANDBOX_EVT")).config.max_age == 3600.0
        await ensure_topology(js)
        assert await _snapshot(js) == before
    finally:
        await nc.close()
