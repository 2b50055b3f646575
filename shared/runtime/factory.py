"""Build the configured ``Runtime`` (``TORPOR_RUNTIME=local|kubernetes``); adapters load lazily so
a service on one runtime never imports the other's dependencies."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from shared.runtime.ports import Runtime
from shared.settings import RuntimeSettings, _Base


class LocalRuntimeSettings(_Base):
    """Local-runtime knobs beyond ``RuntimeSettings``."""

    # TORPOR_LOCAL_FIRST_ADDRESS: pods get loopback addresses from here up (127.0.x.y).
    local_first_address: str = Field(default="127.0.0.2", pattern=r"^127\.\d+\.\d+\.\d+$")


async def open_runtime(
    settings: RuntimeSettings,
    *,
    nats_url: str,
    supervise: bool,
    nats_options: Mapping[str, Any] | None = None,
    local: LocalRuntimeSettings | None = None,
) -> Runtime:
    """A started runtime; the caller ``close()``s it.

    ``supervise``: the local runtime's reconciler (starts, restarts and stops pod processes). The
    scaler supervises; the snapshotter only reads and patches workloads. Pods never stop when a
    service exits (``stop_pods_on_close=False``): a restarted or crashed service must not take
    the sandboxes with it.
    """
    if settings.runtime == "kubernetes":
        from shared.runtime.kubernetes.runtime import KubernetesRuntime
        from shared.runtime.kubernetes.templates import DEFAULT_TEMPLATES, PodTemplates

        templates = (
            PodTemplates(settings.templates_dir, DEFAULT_TEMPLATES)
            if settings.templates_dir
            else None
        )
        return await KubernetesRuntime.from_kubeconfig(
            settings.kubeconfig,
            namespace=settings.namespace,
            templates=templates,
            control_plane_namespace=settings.control_plane_namespace,
        )
    from shared.runtime.local import LocalRuntime

    runtime = LocalRuntime(
        nats_url=nats_url,
        nats_options=nats_options,
        data_dir=settings.data_dir,
        templates_dir=settings.templates_dir,
        supervise=supervise,
        stop_pods_on_close=False,
        first_address=(local or LocalRuntimeSettings()).local_first_address,
    )
    return await runtime.start()
