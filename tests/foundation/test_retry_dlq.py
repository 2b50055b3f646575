"""The retry middleware: a transient failure is redelivered after a delay (NAK with delay, not a
hot loop); a poison message lands in SANDBOX_DLQ with the error in ``x-error``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import nats
from faststream.nats import NatsMessage

from shared.bus.broker import make_broker, prepare, subscriber_args
from shared.bus.retry import PoisonMessage
from shared.bus.server import EmbeddedNats
from shared.bus.topology import SNAPSHOTTER_PAUSE, STREAM_CMD, STREAM_DLQ
from shared.settings import BusSettings


async def _publish(url: str, subject: str, body: bytes) -> None:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().publish(subject, body, stream=STREAM_CMD)
    finally:
        await nc.close()


async def test_transient_failure_is_redelivered_with_backoff(fresh_nats: EmbeddedNats) -> None:
    bus = BusSettings(nats_url=fresh_nats.url)
    broker = make_broker(bus, service="retry-test")
    deliveries: list[float] = []
    done = asyncio.Event()

    @broker.subscriber(**subscriber_args(SNAPSHOTTER_PAUSE, max_workers=1))
    async def handle(body: Any, msg: NatsMessage) -> None:
        deliveries.append(time.monotonic())
        if len(deliveries) == 1:
            raise RuntimeError("transient: the daemon is not reachable yet")
        done.set()

    await prepare(broker, bus)
    await broker.start()
    try:
        await _publish(fresh_nats.url, "sandbox.cmd.pause.sbxretry", b'{"x": 1}')
        await asyncio.wait_for(done.wait(), 15)
    finally:
        await broker.stop()
    assert len(deliveries) == 2
    gap = deliveries[1] - deliveries[0]
    assert gap > 0.5, f"redelivered after {gap:.3f}s: NAK without delay is a hot loop"


async def test_poison_message_lands_in_dlq(fresh_nats: EmbeddedNats) -> None:
    bus = BusSettings(nats_url=fresh_nats.url)
    broker = make_broker(bus, service="poison-test")
    calls = 0

    @broker.subscriber(**subscriber_args(SNAPSHOTTER_PAUSE, max_workers=1))
    async def handle(body: Any, msg: NatsMessage) -> None:
        nonlocal calls
        calls += 1
        raise PoisonMessage("cannot ever handle this")

    await prepare(broker, bus)
    await broker.start()
    nc = await nats.connect(fresh_nats.url)
    try:
        js = nc.jetstream()
        await _publish(fresh_nats.url, "sandbox.cmd.pause.sbxpoison", b'{"bad": true}')
        subject = "sandbox.dlq.snapshotter-pause.sbxpoison"
        dead = None
        for _ in range(100):
            try:
                dead = await js.get_last_msg(STREAM_DLQ, subject)
                break
            except nats.js.errors.NotFoundError:
                await asyncio.sleep(0.1)
        assert dead is not None, "nothing arrived in the DLQ"
        assert dead.data == b'{"bad": true}'
        headers = dead.headers or {}
        assert "cannot ever handle this" in headers["x-error"]
        assert headers["x-src-subject"] == "sandbox.cmd.pause.sbxpoison"
        await asyncio.sleep(1.0)
        assert calls == 1, "a poison message must not be retried"
        # TERM in a work-queue stream removes the original.
        assert (await js.stream_info(STREAM_CMD)).state.messages == 0
    finally:
        await nc.close()
        await broker.stop()
