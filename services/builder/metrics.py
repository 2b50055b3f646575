"""Prometheus metrics of the builder (process-wide, registered once)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

DISK = Gauge(
    "torpor_builder_disk_bytes",
    "Disk the template builds use, as of the last garbage collection: layers (listed by a kept "
    "template), cache (per-step layers no kept template lists), uploads (build contexts)",
    ["kind"],
)
REMOVED = Counter(
    "torpor_builder_gc_removed_total",
    "What the garbage collection removed: layers (of deleted builds), cache (per-step layers "
    "past the age or size bound), staging (partial layers), template_files, uploads",
    ["kind"],
)
FREED = Counter("torpor_builder_gc_freed_bytes_total", "Bytes the garbage collection freed")
SWEEPS = Counter("torpor_builder_gc_sweeps_total", "Garbage collection sweeps done")
