"""``python -m services.scheduler.main``: the scheduler worker (timeouts, auto-pause, retention).

Serves ``/livez``, ``/readyz`` (NATS connected) and ``/metrics`` on ``TORPOR_HEALTH_PORT``.
Stops gracefully on SIGTERM/SIGINT (in-flight messages finish; the rest stay in the durables).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

import structlog

from services.scheduler.bootstrap import SchedulerApp
from services.scheduler.settings import SchedulerSettings, load_settings
from shared.errors import ConfigError
from shared.health import HealthServer
from shared.logging import configure


async def run(settings: SchedulerSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    app = SchedulerApp(settings)
    await app.start()
    health = HealthServer(
        host=settings.timers.health_host, port=settings.timers.health_port, ready=app.ready
    )
    await health.start()
    try:
        await stop.wait()
    finally:
        await health.stop()
        await app.stop()
        structlog.get_logger().info("scheduler_stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torpor-scheduler", description=__doc__)
    parser.add_argument("--health-port", type=int, help="health/metrics port (TORPOR_HEALTH_PORT)")
    args = parser.parse_args(argv)
    try:
        settings = load_settings()
    except ConfigError as e:
        print(f"torpor-scheduler: {e}", file=sys.stderr)
        return 2
    if args.health_port is not None:
        timers = settings.timers.model_copy(update={"health_port": args.health_port})
        settings = settings.model_copy(update={"timers": timers})
    configure(settings.logging, service="scheduler")
    asyncio.run(run(settings))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
