"""The ``main()`` shared by the snapshotter and the scaler: settings, logging, health, runtime,
envd client, worker, until SIGTERM. Each service passes its own host factory."""

from __future__ import annotations

import asyncio
import io
import signal
import sys
from collections.abc import Callable

import structlog

from shared.envd.ports import Envd
from shared.errors import ConfigError, TorporError
from shared.health import HealthServer, HealthSettings
from shared.lifecycle.hosting import WorkerHost, until_signalled
from shared.logging import configure
from shared.runtime.factory import LocalRuntimeSettings, open_runtime
from shared.runtime.ports import Runtime
from shared.settings import BusSettings, LoggingSettings, RuntimeSettings, load

log = structlog.get_logger()

HostFactory = Callable[[BusSettings, Runtime, Envd], WorkerHost]


def run_worker(service: str, make_host: HostFactory, *, supervise_runtime: bool) -> int:
    try:
        bus = load(BusSettings)
        runtime_settings = load(RuntimeSettings)
        health = load(HealthSettings)
        configure(load(LoggingSettings), service=service)
    except ConfigError as e:
        print(f"torpor {service}: {e}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(
            _serve(service, bus, runtime_settings, health, make_host, supervise_runtime)
        )
    except TorporError as e:
        log.error("fatal", error=str(e))
        return 1
    except KeyboardInterrupt:
        return 0


async def _serve(  # noqa: PLR0917 - private, called once
    service: str,
    bus: BusSettings,
    runtime_settings: RuntimeSettings,
    health: HealthSettings,
    make_host: HostFactory,
    supervise_runtime: bool,
) -> int:
    from shared.bus.broker import connect_options
    from shared.envd.client import ConnectEnvdClient  # type: ignore[import-untyped]

    nats_url = bus.nats_url.split(",")[0]
    runtime = await open_runtime(
        runtime_settings,
        nats_url=nats_url,
        # Its replies under the service's own inbox prefix (the only one its NATS user may read).
        nats_options={**connect_options(bus), "inbox_prefix": f"_INBOX_{service}"},
        supervise=supervise_runtime,
        local=load(LocalRuntimeSettings),
    )
    envd = ConnectEnvdClient()
    host = make_host(bus, runtime, envd)
    server = HealthServer(host=health.health_host, port=health.health_port, ready=host.ready)
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, _dump_tasks)
    try:
        await server.start()
        await host.start()
        await until_signalled()
    finally:
        await host.stop()
        await server.stop()
        await envd.close()
        await runtime.close()
    return 0


def _dump_tasks() -> None:
    """``kill -USR2 <pid>``: log every asyncio task's stack (where is a handler stuck?)."""
    for task in asyncio.all_tasks():
        out = io.StringIO()
        task.print_stack(file=out)
        log.warning("task_stack", task=task.get_name(), stack=out.getvalue())
