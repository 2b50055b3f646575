"""A tiny worker process for the kill -9 test: records every message it handles in a file.

``python durable_worker.py NATS_URL OUT_FILE``. A message whose body starts with ``hold`` is
recorded as ``holding:<body>`` on its first delivery and never acknowledged (the test kills the
process meanwhile); on a later delivery it is handled like any other.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from faststream.nats import NatsMessage

from shared.bus.broker import make_broker, prepare, subscriber_args
from shared.settings import BusSettings
from tests.foundation.durables import TEST_DURABLE


def _record(out: Path, line: str) -> None:
    with out.open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


async def main(url: str, out: Path) -> None:
    bus = BusSettings(nats_url=url)
    broker = make_broker(bus, service="durable-worker")

    @broker.subscriber(**subscriber_args(TEST_DURABLE, max_workers=1))
    async def handle(body: Any, msg: NatsMessage) -> None:
        text = msg.body.decode()
        if text.startswith("hold") and msg.raw_message.metadata.num_delivered == 1:
            _record(out, f"holding:{text}")
            await asyncio.sleep(3600)
        _record(out, f"done:{text}")

    await prepare(broker, bus)
    await broker.start()
    _record(out, f"started:{os.getpid()}")
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await broker.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
