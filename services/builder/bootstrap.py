"""Composition root of the builder: ports in, a running worker out."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from faststream.nats import NatsRouter

from services.builder.building import Builder
from services.builder.builds import UNSUPPORTED_ON_KUBERNETES, BuildRuntime, Limits
from services.builder.collecting import Collector, Policy
from services.builder.handlers import build_router
from services.builder.metrics import BuilderMetrics
from services.builder.oci_build import ImageBuilder, ImageRuntime
from services.builder.settings import BuilderSettings
from shared.bus.broker import key_value
from shared.bus.snapshot_store import KvSnapshotStore
from shared.bus.template_store import KvTemplateStore
from shared.bus.topology import BUILDER_BUILDS, KV_SNAPSHOTS, KV_TEMPLATES
from shared.envd.client import ConnectEnvdClient
from shared.errors import ConfigError
from shared.lifecycle.hosting import Context, Parts, WorkerHost
from shared.runtime.local import rootfs as rootfs_location
from shared.runtime.local.workloads import LocalRuntime
from shared.settings import RuntimeSettings, load


class BuilderHost(WorkerHost):
    """The worker host plus the builder's periodic garbage collection (local runtime)."""

    def __init__(self, *, collector: Callable[[Parts], Collector] | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._collector = collector
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Parts:
        parts = await super().start()
        if self._collector is not None:
            self._task = asyncio.create_task(self._collector(parts).run(), name="template-gc")
        return parts

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await super().stop()


def builder_host(ctx: Context, settings: BuilderSettings) -> WorkerHost:
    runtime, envd = ctx.pods()
    metrics = BuilderMetrics(ctx.registry)  # once per host: its builds share it
    runtime_settings = load(RuntimeSettings)
    local = runtime_settings.runtime == "local"
    if not isinstance(envd, ConnectEnvdClient):
        msg = "the builder needs the Connect daemon client"
        raise ConfigError(msg)

    limits = Limits(memory=settings.memory, cpu=settings.cpu, disk=settings.disk)

    def build(parts: Parts) -> NatsRouter:
        store = KvTemplateStore(lambda: key_value(parts.broker, KV_TEMPLATES))
        builder: Builder
        if not local and settings.registry is not None:
            from shared.oci.registry import Registry

            password = settings.registry_password
            builder = ImageBuilder(
                store=store,
                runtime=cast(ImageRuntime, runtime),
                commands=envd,
                registry=Registry(
                    settings.registry_host(),
                    insecure=settings.registry_insecure,
                    username=settings.registry_username,
                    password=password.get_secret_value() if password else None,
                ),
                prefix=settings.registry_prefix(),
                base_image=settings.base_image,
                data_dir=runtime_settings.data_dir.resolve(),
                step_timeout=settings.step_timeout,
                pod_ready_timeout=settings.pod_ready_timeout,
                allow_internet=settings.allow_internet,
                egress_allow=settings.egress_allow_list,
                limits=limits,
            )
            return build_router(
                builder, retry=BUILDER_BUILDS.retry, max_workers=settings.max_workers
            )
        builder = Builder(
            store=store,
            runtime=cast(BuildRuntime, runtime),
            commands=envd,
            data_dir=runtime_settings.data_dir.resolve(),
            rootfs=rootfs_location.locate() if local else Path("/nonexistent"),
            step_timeout=settings.step_timeout,
            pod_ready_timeout=settings.pod_ready_timeout,
            allow_internet=settings.allow_internet,
            egress_allow=settings.egress_allow_list,
            limits=limits,
            # Kubernetes without a registry: every build fails with this reason.
            unsupported=None if local else UNSUPPORTED_ON_KUBERNETES,
        )
        return build_router(builder, retry=BUILDER_BUILDS.retry, max_workers=settings.max_workers)

    def collector(parts: Parts) -> Collector:
        assert isinstance(runtime, LocalRuntime)
        return Collector(
            data_dir=runtime_settings.data_dir.resolve(),
            builds=KvTemplateStore(lambda: key_value(parts.broker, KV_TEMPLATES)),
            workloads=runtime,
            sandboxes=parts.store,
            snapshots=KvSnapshotStore(lambda: key_value(parts.broker, KV_SNAPSHOTS)),
            policy=Policy(
                interval=settings.gc_interval,
                grace=settings.gc_grace,
                cache_max_age=settings.gc_cache_max_age,
                cache_max_bytes=settings.gc_cache_max_bytes,
                upload_max_age=settings.gc_upload_max_age,
            ),
            metrics=metrics,
        )

    # Kubernetes: the images in the registry are the registry's to collect.
    return BuilderHost(
        service="builder",
        bus=ctx.bus,
        build=build,
        collector=collector if isinstance(runtime, LocalRuntime) else None,
    )
