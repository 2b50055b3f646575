"""``read_size``: what a template provisions for each of its sandboxes (cores, memory, the disk a
paused sandbox keeps), for either runtime. The usage ledger weighs time by it.

``None`` for a figure the template does not set (the caller's default applies). ``NotFound`` /
``ConfigError`` / ``ValueError`` when the template cannot be read.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from shared.runtime.templates import load_template, parse_bytes, parse_millicpu, template_dirs


class TemplateSize(BaseModel):
    model_config = ConfigDict(frozen=True)

    cpu: float | None = None  # cores
    memory_bytes: int | None = None
    kept_bytes: int | None = None  # 0: the template persists nothing across a pause


def read_size(
    runtime: str, templates_dir: Path | None, built_dir: Path | None, name: str
) -> TemplateSize:
    if runtime == "kubernetes":
        from shared.runtime.kubernetes.objects import claim_size, persist_mode
        from shared.runtime.kubernetes.templates import DEFAULT_TEMPLATES, PodTemplates

        sources = (templates_dir, DEFAULT_TEMPLATES) if templates_dir else (DEFAULT_TEMPLATES,)
        pod_template = PodTemplates(*sources).get(name)
        cpu, memory = _pod_limits(pod_template)
        kept = 0 if persist_mode(pod_template) == "none" else parse_bytes(claim_size(pod_template))
        return TemplateSize(cpu=cpu, memory_bytes=memory, kept_bytes=kept)
    # Local: the operator's folder, then the templates users built (named by build id), then
    # the packaged ones -- the search path the local runtime itself uses.
    template = load_template(name, template_dirs(templates_dir, built=built_dir))
    limits = template.resources.limits
    millis = limits.cpu_millis
    return TemplateSize(
        cpu=None if millis is None else millis / 1000,
        memory_bytes=limits.memory_bytes,
        kept_bytes=0 if template.persist == "none" else limits.disk_bytes,
    )


def _pod_limits(pod_template: Mapping[str, Any]) -> tuple[float | None, int | None]:
    """The sum of the containers' cpu and memory limits (``None`` if no container sets one)."""
    cpu: float | None = None
    memory: int | None = None
    for container in (pod_template.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        if "cpu" in limits:
            cpu = (cpu or 0) + parse_millicpu(str(limits["cpu"])) / 1000
        if "memory" in limits:
            memory = (memory or 0) + parse_bytes(str(limits["memory"]))
    return cpu, memory
