"""Prometheus metrics of the builder, made on the registry of the process it is given
(``shared.lifecycle.hosting.Context.registry``), never as module globals."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class BuilderMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.disk = Gauge(
            "torpor_builder_disk_bytes",
            "Disk the template builds use, as of the last garbage collection: layers (listed by a "
            "kept template), cache (per-step layers no kept template lists), uploads (build "
            "contexts)",
            ["kind"],
            registry=registry,
        )
        self.removed = Counter(
            "torpor_builder_gc_removed_total",
            "What the garbage collection removed: layers (of deleted builds), cache (per-step "
            "layers past the age or size bound), staging (partial layers), template_files, uploads",
            ["kind"],
            registry=registry,
        )
        self.freed = Counter(
            "torpor_builder_gc_freed_bytes_total",
            "Bytes the garbage collection freed",
            registry=registry,
        )
        self.sweeps = Counter(
            "torpor_builder_gc_sweeps_total", "Garbage collection sweeps done", registry=registry
        )
