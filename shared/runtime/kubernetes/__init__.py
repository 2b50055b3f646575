"""Kubernetes adapter of the runtime port (the only control-plane code importing ``kubernetes``)."""

from shared.runtime.kubernetes.runtime import KubernetesRuntime
from shared.runtime.kubernetes.templates import DEFAULT_TEMPLATES, PodTemplates

__all__ = ["DEFAULT_TEMPLATES", "KubernetesRuntime", "PodTemplates"]
