"""Prometheus metrics of the builder, made on the registry of the process it is given
(``shared.lifecycle.hosting.Context.registry``), never as module globals."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from shared.metrics import Declare


class BuilderMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        new = Declare(registry)
        self.disk = new.gauge(
            "torpor_builder_disk_bytes",
            "Disk the template builds use, as of the last garbage collection: layers (listed by a "
            "kept template), cache (per-step layers no kept template lists), uploads (build "
            "contexts)",
            "kind",
        )
        self.removed = new.counter(
            "torpor_builder_gc_removed_total",
            "What the garbage collection removed: layers (of deleted builds), cache (per-step "
            "layers past the age or size bound), staging (partial layers), template_files, uploads",
            "kind",
        )
        self.freed = new.counter(
            "torpor_builder_gc_freed_bytes_total", "Bytes the garbage collection freed"
        )
        self.sweeps = new.counter(
            "torpor_builder_gc_sweeps_total", "Garbage collection sweeps done"
        )
