"""Every line a bus service writes goes through torpor's renderer and redaction.

FastStream ships its own access logger: colour text on stdout for every message, past the JSON
renderer pods are read with and past ``shared.redaction``. The broker is given ours instead.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys

import pytest
import structlog

from shared.bus.broker import make_broker
from shared.logging import configure
from shared.settings import BusSettings, LoggingSettings

SECRET = "e2b_" + "5f" * 20


async def test_a_failing_message_leaves_json_lines_only_and_no_secret(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both loggers bind the streams that exist when they are configured.
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    configure(LoggingSettings(log_format="json", log_level="info"), service="test")
    broker = make_broker(BusSettings(nats_url=nats_url), service="test")
    handled = asyncio.Event()

    @broker.subscriber("torpor.test.logging")
    async def fail(body: str) -> None:
        handled.set()
        raise RuntimeError(f"boom {body}")

    try:
        await broker.start()
        await broker.publish(SECRET, "torpor.test.logging")
        await asyncio.wait_for(handled.wait(), 10)
        await asyncio.sleep(0.2)  # the middleware's line comes after the handler returns
        await broker.stop()
    finally:
        structlog.reset_defaults()
        logging.getLogger().handlers.clear()
    assert out.getvalue() == ""  # nothing on stdout: FastStream's access logger is not in use
    lines = [json.loads(line) for line in err.getvalue().splitlines() if line.strip()]
    assert any(line["event"] == "handler_failed_will_retry" for line in lines)
    assert SECRET not in err.getvalue()
    # FastStream's per-message lines ("Received", "Processed") are DEBUG: not at level info.
    assert not any(line["event"] in {"Received", "Processed"} for line in lines)
