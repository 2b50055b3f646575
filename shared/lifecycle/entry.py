"""The ``main()`` of every worker: settings, logging, health, runtime and daemon client (for the
services that move pods), the ``WorkerHost``, until SIGTERM.

A service states what it needs in a ``WorkerSpec`` and its ``main`` is ``run_worker(SPEC, argv)``.
Bad configuration is one line on stderr and exit code 2, before anything starts.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

import structlog
from prometheus_client import REGISTRY

from shared.errors import ConfigError, TorporError
from shared.health import HealthServer, inherited_listener
from shared.lifecycle.hosting import Context, WorkerHost, until_signalled
from shared.logging import configure
from shared.ports.envd import Envd
from shared.ports.runtime import Runtime
from shared.runtime.factory import LocalRuntimeSettings, open_runtime
from shared.settings import (
    BusSettings,
    FeatureFlags,
    HealthSettings,
    LoggingSettings,
    RetentionSettings,
    RuntimeSettings,
    load,
)

log = structlog.get_logger()

S = TypeVar("S")

# none: no pods (the scheduler); client: reaches the runtime; supervise: also runs its reconciler
# (one service per machine supervises the local runtime's pods: the scaler).
RuntimeUse = Literal["none", "client", "supervise"]


@dataclass(frozen=True)
class WorkerSpec(Generic[S]):
    service: str
    settings: Callable[[], S]  # reads the service's own settings (ConfigError: exit 2)
    host: Callable[[Context, S], WorkerHost]
    runtime: RuntimeUse = "none"
    health_port: int = 8080
    # Moves kept files (Kubernetes ``persist: store``): its NATS user may use the object store.
    kept_files: bool = False  # when neither TORPOR_HEALTH_PORT nor --health-port is given


@dataclass(frozen=True)
class _Config(Generic[S]):
    bus: BusSettings
    retention: RetentionSettings
    flags: FeatureFlags
    settings: S
    health_host: str
    health_port: int
    health_sock: socket.socket | None  # handed down by a supervisor: served, not bound
    runtime: RuntimeSettings | None
    local: LocalRuntimeSettings | None


def run_worker(spec: WorkerSpec[S], argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"torpor-{spec.service}")
    parser.add_argument("--health-port", type=int, help="health/metrics port (TORPOR_HEALTH_PORT)")
    args = parser.parse_args(argv)
    try:
        health = load(HealthSettings)
        port = health.health_port if "health_port" in health.model_fields_set else spec.health_port
        pods = spec.runtime != "none"
        config = _Config(
            bus=load(BusSettings),
            retention=load(RetentionSettings),
            flags=load(FeatureFlags),
            settings=spec.settings(),
            health_host=health.health_host,
            health_port=args.health_port if args.health_port is not None else port,
            health_sock=(
                inherited_listener(health.health_fd)
                if health.health_fd is not None and args.health_port is None
                else None
            ),
            runtime=load(RuntimeSettings) if pods else None,
            local=load(LocalRuntimeSettings) if pods else None,
        )
        configure(load(LoggingSettings), service=spec.service)
    except ConfigError as e:
        print(f"torpor {spec.service}: {e}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_serve(spec, config))
    except TorporError as e:
        log.error("fatal", error=str(e))
        return 1
    except KeyboardInterrupt:
        return 0


async def _serve(spec: WorkerSpec[S], config: _Config[S]) -> int:
    runtime, envd = await _open_pods(spec, config)
    try:
        ctx = Context(
            bus=config.bus,
            retention=config.retention,
            flags=config.flags,
            runtime=runtime,
            envd=envd,
            registry=REGISTRY,  # the process's one registry, with the process collectors
        )
        host = spec.host(ctx, config.settings)
        server = HealthServer(
            host=config.health_host,
            port=config.health_port,
            ready=host.ready,
            sock=config.health_sock,
            registry=ctx.registry,
        )
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, _dump_tasks)
        try:
            await server.start()
            await host.start()
            await until_signalled()
        finally:
            await host.stop()
            await server.stop()
    finally:
        if envd is not None:
            await envd.close()
        if runtime is not None:
            await runtime.close()
    log.info("worker_stopped", service=spec.service)
    return 0


async def _open_pods(spec: WorkerSpec[S], config: _Config[S]) -> tuple[Runtime | None, Envd | None]:
    if config.runtime is None:
        return None, None
    from shared.bus.broker import connect_options
    from shared.envd.client import ConnectEnvdClient

    runtime = await open_runtime(
        config.runtime,
        nats_url=config.bus.nats_url.split(",")[0],
        # Its replies under the service's own inbox prefix (the only one its NATS user may read).
        nats_options={**connect_options(config.bus), "inbox_prefix": f"_INBOX_{spec.service}"},
        supervise=spec.runtime == "supervise",
        local=config.local,
        kept_files=spec.kept_files,
    )
    return runtime, ConnectEnvdClient()


def _dump_tasks() -> None:
    """``kill -USR2 <pid>``: log every asyncio task's stack (where is a handler stuck?)."""
    for task in asyncio.all_tasks():
        out = io.StringIO()
        task.print_stack(file=out)
        log.warning("task_stack", task=task.get_name(), stack=out.getvalue())
