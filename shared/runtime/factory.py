"""Build the configured ``Runtime`` (``TORPOR_RUNTIME=local|kubernetes``); adapters load lazily so
a service on one runtime never imports the other's dependencies."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, field_validator

from shared.errors import ConfigError
from shared.ports.runtime import Runtime
from shared.settings import RuntimeSettings, SettingsBase


class LocalRuntimeSettings(SettingsBase):
    """Local-runtime knobs beyond ``RuntimeSettings``."""

    pod_cidr: str = "auto"
    """local: the private IPv4 range pods take their addresses from (each pod has its own
    network namespace; its daemon listens on `<pod address>:49983`). `auto` takes the first
    `/20` of `10.224.0.0/12` that no route or address of the host overlaps; an explicit range
    (private, `/16`-`/28`) that overlaps one is refused with one line, exit 2. Kept by the
    instance while its pods may run (see [security.md](security.md#local-runtime-network)).
    Needs root, `ip` and `nft`."""

    @field_validator("pod_cidr")
    @classmethod
    def _check_pod_cidr(cls, value: str) -> str:
        from shared.runtime.local.network.subnet import parse_setting

        try:
            parse_setting(value)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return value

    pod_log_bytes: int = Field(default=8 * 2**20, ge=64 * 2**10, le=2**30)
    """local: bytes of a pod's own output (its PID 1's and daemon's stdout and stderr) kept on
    the host, the newest; what the pod writes beyond goes. Read back by the API's errors and the
    dead pod's `logs/<sandbox>.last.log`."""


async def open_runtime(
    settings: RuntimeSettings,
    *,
    nats_url: str,
    supervise: bool,
    nats_options: Mapping[str, Any] | None = None,
    local: LocalRuntimeSettings | None = None,
    kept_files: bool = False,
) -> Runtime:
    """A started runtime; the caller ``close()``s it.

    ``supervise``: the local runtime's reconciler (starts, restarts and stops pod processes). The
    scaler supervises; the snapshotter only reads and patches workloads. Pods never stop when a
    service exits (``stop_pods_on_close=False``): a restarted or crashed service must not take
    the sandboxes with it.

    ``kept_files``: the Kubernetes runtime moves ``persist: store`` sandboxes' files through the
    kept-files store (the snapshotter's and the scaler's); without it such a sandbox's pause or
    resume is ``Unsupported`` and a delete leaves no object behind it to remove.
    """
    if settings.runtime == "kubernetes":
        from shared.bus.kept_files import NatsKeptFiles
        from shared.runtime.kubernetes.runtime import KubernetesRuntime
        from shared.runtime.kubernetes.templates import DEFAULT_TEMPLATES, PodTemplates

        templates = (
            PodTemplates(settings.templates_dir, DEFAULT_TEMPLATES)
            if settings.templates_dir
            else None
        )
        kube = await KubernetesRuntime.from_kubeconfig(
            settings.kubeconfig,
            namespace=settings.namespace,
            templates=templates,
            control_plane_namespace=settings.control_plane_namespace,
            storage_class=settings.storage_class,
            pools=settings.pool_sizes,
            # persist: store templates' files while paused (its own connection, on first use);
            # only for services whose NATS user may use the bucket (snapshotter, scaler)
            kept_files=NatsKeptFiles.connecting(nats_url, nats_options) if kept_files else None,
        )
        if supervise:  # the scaler keeps the pools filled; every runtime may claim from them
            kube.start_pools(
                claim_timeout=settings.pool_claim_timeout,
                start_timeout=settings.pool_start_timeout,
            )
        return kube
    from shared.runtime.local import LocalRuntime

    runtime = LocalRuntime(
        nats_url=nats_url,
        nats_options=nats_options,
        data_dir=settings.data_dir,
        templates_dir=settings.templates_dir,
        supervise=supervise,
        stop_pods_on_close=False,
        pod_cidr=(local or LocalRuntimeSettings()).pod_cidr,
        pod_log_bytes=(local or LocalRuntimeSettings()).pod_log_bytes,
        pools=settings.pool_sizes,
    )
    return await runtime.start()
