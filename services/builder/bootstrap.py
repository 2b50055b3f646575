"""Composition root of the builder: ports in, a running worker out."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from faststream.nats import NatsRouter

from services.builder.building import (
    UNSUPPORTED_ON_KUBERNETES,
    Builder,
    BuildRuntime,
    Limits,
)
from services.builder.handlers import build_router
from services.builder.settings import BuilderSettings
from shared.bus.broker import key_value
from shared.bus.template_store import KvTemplateStore
from shared.bus.topology import BUILDER_BUILDS, KV_TEMPLATES
from shared.envd.client import ConnectEnvdClient
from shared.errors import ConfigError
from shared.lifecycle.hosting import Context, Parts, WorkerHost
from shared.runtime.local import rootfs as rootfs_location
from shared.settings import RuntimeSettings, load


def builder_host(ctx: Context, settings: BuilderSettings) -> WorkerHost:
    runtime, envd = ctx.pods()
    runtime_settings = load(RuntimeSettings)
    local = runtime_settings.runtime == "local"
    if not isinstance(envd, ConnectEnvdClient):
        msg = "the builder needs the Connect daemon client"
        raise ConfigError(msg)

    def build(parts: Parts) -> NatsRouter:
        builder = Builder(
            store=KvTemplateStore(lambda: key_value(parts.broker, KV_TEMPLATES)),
            runtime=cast(BuildRuntime, runtime),
            commands=envd,
            data_dir=runtime_settings.data_dir.resolve(),
            rootfs=rootfs_location.locate() if local else Path("/nonexistent"),
            step_timeout=settings.step_timeout,
            pod_ready_timeout=settings.pod_ready_timeout,
            allow_internet=settings.allow_internet,
            limits=Limits(memory=settings.memory, cpu=settings.cpu, disk=settings.disk),
            # Kubernetes: image builds pushed to a registry are not built yet; every build
            # fails with this reason instead of hanging.
            unsupported=None if local else UNSUPPORTED_ON_KUBERNETES,
        )
        return build_router(builder, retry=BUILDER_BUILDS.retry, max_workers=settings.max_workers)

    return WorkerHost(service="builder", bus=ctx.bus, build=build)
