"""Kubernetes adapter of the runtime port (the only control-plane code importing ``kubernetes``).

``KubernetesRuntime`` is imported on first use: importing the Kubernetes client costs seconds,
and readers of the templates alone (template facts, the unit tier) do not need it."""

from typing import TYPE_CHECKING

from shared.runtime.kubernetes.templates import DEFAULT_TEMPLATES, PodTemplates

if TYPE_CHECKING:
    from shared.runtime.kubernetes.runtime import KubernetesRuntime

__all__ = ["DEFAULT_TEMPLATES", "KubernetesRuntime", "PodTemplates"]


def __getattr__(name: str) -> object:
    if name == "KubernetesRuntime":
        from shared.runtime.kubernetes.runtime import KubernetesRuntime

        return KubernetesRuntime
    raise AttributeError(name)
