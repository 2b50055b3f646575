"""Garbage collection of what template builds leave on disk (local runtime), a periodic sweep
of the builder.

What is kept (the roots), read fresh at every sweep:

- every build still recorded (a template's builds go with it: ``DELETE /templates/{id}``):
  its template file (``<data dir>/built-templates/<build id>.yaml``) and a ready one's layers;
- every template a sandbox may still start a pod from: the templates of the local runtime's
  workload records (running, paused, warm in a pool or being deleted: their pods mount its
  layers), of sandbox records not killed (a create in flight has a record before a workload),
  and of stored snapshots (a create from one starts on its sandbox's template). So a sandbox of
  a deleted template runs on, and a paused one resumes, until it is gone.

What goes:

- the template file of a build no longer recorded and no longer used, ``grace`` seconds after
  a sweep first saw it so (a create that read the build just before the delete has a record by
  then), and the layers only it listed;
- a build pod's template file (``bld-*``) once no pod uses it, after the same grace;
- staging folders (a build's partial layer, left by a crash or a failed step): a sweep runs only
  while no build runs (``template_layers.sweeping``), so none of them is in use;
- the per-step cache, the layers no kept template lists (the steps of failed builds, of builds
  never finished): those unused (made or reused by a build) for ``cache_max_age``, then the
  least recently used ones beyond ``cache_max_bytes``;
- uploaded build contexts no waiting or running build needs, unused (uploaded, or reported
  present to the SDK) for ``upload_max_age``, and half-written uploads as old.

Each sweep reports the disk in use (``torpor_builder_disk_bytes``) and what it removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import structlog
import yaml
from prometheus_client import CollectorRegistry

from services.builder.metrics import BuilderMetrics
from shared.domain.record import SandboxRecord
from shared.domain.states import SandboxState
from shared.models.snapshot_records import SnapshotRecord
from shared.models.template_records import (
    BUILT_TEMPLATES_DIR,
    TEMPLATE_FILES_DIR,
    BuildRecord,
    BuildStatus,
    blob_path,
)
from shared.runtime.local import template_layers

log = structlog.get_logger()

BUILD_POD_PREFIX = "bld-"


class Builds(Protocol):
    async def list_all_builds(self) -> list[BuildRecord]: ...


class Workloads(Protocol):
    async def templates_in_use(self) -> set[str]: ...


class Sandboxes(Protocol):
    async def list(self) -> list[SandboxRecord]: ...


class Snapshots(Protocol):
    async def list(self) -> list[SnapshotRecord]: ...


@dataclass(frozen=True)
class Policy:
    interval: float = 300.0
    grace: float = 600.0
    cache_max_age: float = 7 * 86400.0
    cache_max_bytes: int = 20 * 2**30
    upload_max_age: float = 86400.0


@dataclass
class Report:
    swept: bool
    layer_bytes: int = 0  # layers a kept template lists
    cache_bytes: int = 0  # layers kept as the per-step cache
    upload_bytes: int = 0
    removed: dict[str, int] = field(default_factory=dict)  # kind -> count
    freed_bytes: int = 0

    def count(self, kind: str, freed: int) -> None:
        self.removed[kind] = self.removed.get(kind, 0) + 1
        self.freed_bytes += freed


class Collector:
    def __init__(
        self,
        *,
        data_dir: Path,
        builds: Builds,
        workloads: Workloads,
        sandboxes: Sandboxes,
        snapshots: Snapshots,
        policy: Policy,
        metrics: BuilderMetrics | None = None,
    ) -> None:
        self._metrics = metrics if metrics is not None else BuilderMetrics(CollectorRegistry())
        self._data_dir = data_dir
        self._builds = builds
        self._workloads = workloads
        self._sandboxes = sandboxes
        self._snapshots = snapshots
        self.policy = policy
        self._unused_since: dict[str, float] = {}  # template file -> first sweep that saw it so
        self._sizes: dict[str, int] = {}  # layer key -> bytes (a layer never changes)

    async def run(self) -> None:
        """Sweep every ``interval`` seconds until cancelled; a failed sweep is logged, not fatal."""
        while True:
            try:
                await self.sweep()
            except Exception as e:  # the next sweep tries again
                log.warning("template_gc_failed", error=repr(e))
            await asyncio.sleep(self.policy.interval)

    async def sweep(self, now: float | None = None) -> Report:
        with template_layers.sweeping(self._data_dir) as held:
            if not held:
                log.info("template_gc_skipped", reason="a build is running")
                return Report(swept=False)
            builds = await self._builds.list_all_builds()
            in_use = await self._templates_in_use()
            report = await asyncio.to_thread(
                self._sweep_files, builds, in_use, time.time() if now is None else now
            )
        self._metrics.disk.labels("layers").set(report.layer_bytes)
        self._metrics.disk.labels("cache").set(report.cache_bytes)
        self._metrics.disk.labels("uploads").set(report.upload_bytes)
        for kind, n in report.removed.items():
            self._metrics.removed.labels(kind).inc(n)
        self._metrics.freed.inc(report.freed_bytes)
        self._metrics.sweeps.inc()
        log.info(
            "template_gc",
            layer_bytes=report.layer_bytes,
            cache_bytes=report.cache_bytes,
            upload_bytes=report.upload_bytes,
            removed=report.removed,
            freed_bytes=report.freed_bytes,
        )
        return report

    async def _templates_in_use(self) -> set[str]:
        used = await self._workloads.templates_in_use()
        used |= {r.template for r in await self._sandboxes.list() if r.state != SandboxState.KILLED}
        used |= {s.template for s in await self._snapshots.list()}
        return used

    # ---- on disk (a thread) -----------------------------------------------------------------

    def _sweep_files(self, builds: list[BuildRecord], in_use: set[str], now: float) -> Report:
        report = Report(swept=True)
        roots = {key for b in builds if b.artifact for key in b.artifact.layers}
        recorded = {b.build_id for b in builds}
        going = self._template_files(recorded | in_use, roots, now)
        orphaned = {key for _, layers in going for key in layers} - roots
        self._layers(roots, orphaned, report, now)
        for path, _ in going:  # after their layers: a crash in between leaves cache entries
            with contextlib.suppress(OSError):
                path.unlink()
                report.count("template_files", 0)
        self._uploads(builds, report, now)
        return report

    def _template_files(
        self, kept: set[str], roots: set[str], now: float
    ) -> list[tuple[Path, list[str]]]:
        """Adds the layers of kept template files to ``roots``; returns those to remove."""
        going: list[tuple[Path, list[str]]] = []
        folder = self._data_dir / BUILT_TEMPLATES_DIR
        seen: set[str] = set()
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
            name = path.stem
            seen.add(name)
            layers = _layers_of(path)
            if name in kept:
                self._unused_since.pop(name, None)
                roots.update(layers)
                continue
            since = self._unused_since.setdefault(name, now)
            if now - since < self.policy.grace:
                roots.update(layers)
                continue
            # A build pod's layers are a build's steps: the cache rule decides, not this.
            going.append((path, [] if name.startswith(BUILD_POD_PREFIX) else layers))
        for name in set(self._unused_since) - seen:
            del self._unused_since[name]
        return going

    def _layers(self, roots: set[str], orphaned: set[str], report: Report, now: float) -> None:
        folder = template_layers.root(self._data_dir)
        cache: list[tuple[float, str, int]] = []
        for entry in list(os.scandir(folder)) if folder.is_dir() else []:
            name = entry.name
            if name == template_layers.LOCK_FILE:
                continue
            if not template_layers.is_key(name) or entry.is_symlink():
                # A staging folder, a COPY step's scratch, a half-removed layer: no build runs.
                template_layers.remove(self._data_dir, name)
                report.count("staging", 0)
                continue
            size = self._size(name)
            if name in roots:
                report.layer_bytes += size
            elif name in orphaned:
                self._drop(name, size, report, "layers")
            else:
                with contextlib.suppress(OSError):
                    cache.append((entry.stat(follow_symlinks=False).st_mtime, name, size))
        cache.sort()  # least recently used first
        total = sum(size for _, _, size in cache)
        for used, name, size in cache:
            if now - used > self.policy.cache_max_age or total > self.policy.cache_max_bytes:
                self._drop(name, size, report, "cache")
                total -= size
        report.cache_bytes = total

    def _drop(self, key: str, size: int, report: Report, kind: str) -> None:
        template_layers.remove(self._data_dir, key)
        self._sizes.pop(key, None)
        report.count(kind, size)

    def _size(self, key: str) -> int:
        if key not in self._sizes:
            self._sizes[key] = template_layers.size(template_layers.tree(self._data_dir, key))
        return self._sizes[key]

    def _uploads(self, builds: Iterable[BuildRecord], report: Report, now: float) -> None:
        root = self._data_dir / TEMPLATE_FILES_DIR
        waiting = {
            blob_path(root, b.owner, step.files_hash)
            for b in builds
            if b.status in (BuildStatus.WAITING, BuildStatus.BUILDING) and b.spec is not None
            for step in b.spec.steps
            if step.files_hash is not None
        }
        for path in root.glob("*/*") if root.is_dir() else []:
            try:
                st = path.lstat()
            except OSError:
                continue
            if path in waiting or now - st.st_mtime <= self.policy.upload_max_age:
                report.upload_bytes += st.st_size
                continue
            with contextlib.suppress(OSError):
                path.unlink()
                report.count("uploads", st.st_size)


def _layers_of(path: Path) -> list[str]:
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return []
    layers = document.get("layers") if isinstance(document, dict) else None
    if not isinstance(layers, list):
        return []
    return [k for k in layers if isinstance(k, str) and template_layers.is_key(k)]
