"""Files of workloads: a paused workload's kept files (the snapshot code's port; see
``.layers``) and the files of stored snapshots (see ``.snapshot_files``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from shared.errors import Conflict, NotFound
from shared.runtime.local import mounts, snapshot_files
from shared.runtime.local.instance import RuntimeInstance
from shared.runtime.local.layers import Layers
from shared.runtime.local.records import WorkloadRecord
from shared.runtime.templates import Template, load_template


class FileKeeping(RuntimeInstance):
    # ---- kept files (the snapshot code's port; see .layers) ------------------------------

    async def export_files(self, name: str, dest: Path) -> None:
        """Copy the kept files of paused workload ``name`` into ``dest`` (a new folder), with
        the sandbox's own ids. ``Conflict`` while a pod runs."""
        record, layers, disk_bytes = await self._stopped(name)
        assert record.id_base is not None
        await asyncio.to_thread(
            layers.export, name, dest, base=record.id_base, disk_bytes=disk_bytes
        )

    async def import_files(self, name: str, source: Path) -> None:
        """Start workload ``name`` (created with ``replicas=0``, never run) from files of
        :meth:`export_files`; scale it to 1 afterwards."""
        record, layers, disk_bytes = await self._stopped(name)
        assert record.id_base is not None
        await asyncio.to_thread(
            layers.restore, name, source, base=record.id_base, disk_bytes=disk_bytes
        )

    async def _stopped(self, name: str) -> tuple[WorkloadRecord, Layers, int | None]:
        current = await self._store.get(name)
        if current is None or current[0].deleting:
            msg = f"workload {name} not found"
            raise NotFound(msg)
        record = current[0]
        if (
            record.pod is not None
            or record.terminating
            or record.replicas
            or self._launcher is None
        ):
            msg = f"workload {name} has a pod: its files can be copied only while it is stopped"
            raise Conflict(msg)
        if record.id_base is None:
            msg = f"workload {name} has no id range yet"
            raise Conflict(msg)
        template = await asyncio.to_thread(load_template, record.template, self._template_dirs)
        if template.persist != "layer":
            msg = f"workload {name} keeps no files (template {record.template}: persist none)"
            raise Conflict(msg)
        return record, self._launcher.layers, template.resources.limits.disk_bytes

    # ---- files of stored snapshots (see .snapshot_files) ---------------------------------

    async def _snapshot_parts(
        self, name: str
    ) -> tuple[WorkloadRecord, Layers, Template, dict[str, Path]]:
        """The workload, its layers, template and own writable volumes (``volume-<name>``)."""
        current = await self._store.get(name)
        if current is None or current[0].deleting:
            raise NotFound(f"workload {name} not found")
        record = current[0]
        if record.id_base is None or self._launcher is None:
            raise Conflict(f"workload {name} has no id range yet")
        template = await asyncio.to_thread(load_template, record.template, self._template_dirs)
        volumes = {
            f"volume-{v.name}": v.resolve(self._data_dir, sandbox_id=name, owner=record.owner)
            for v in template.volumes
            if not v.read_only and "{sandbox_id}" in v.host_path
        }
        return record, self._launcher.layers, template, volumes

    async def save_files(self, name: str, snapshot_id: str) -> int:
        record, layers, template, volumes = await self._snapshot_parts(name)
        assert record.id_base is not None
        disk_bytes = template.resources.limits.disk_bytes
        in_use = await asyncio.to_thread(mounts.is_mounted, layers.folder(name) / "mnt")
        # A running pod's layer (either persist mode) or a paused sandbox's kept one; a paused
        # `persist: none` sandbox has no files to keep.
        layer = (
            layers.mounted(name, base=record.id_base, disk_bytes=disk_bytes)
            if in_use or template.persist == "layer"
            else None
        )
        return await asyncio.to_thread(
            snapshot_files.save,
            self._data_dir,
            snapshot_id,
            layer=layer,
            volumes=volumes,
            id_base=record.id_base,
        )

    async def restore_files(self, snapshot_id: str, name: str) -> None:
        record, layers, template, volumes = await self._snapshot_parts(name)
        assert record.id_base is not None
        if record.pod is not None or record.terminating or record.replicas:
            raise Conflict(f"workload {name} has run: files are restored before its first pod")
        await asyncio.to_thread(
            snapshot_files.restore,
            self._data_dir,
            snapshot_id,
            layers=layers,
            name=name,
            id_base=record.id_base,
            disk_bytes=template.resources.limits.disk_bytes,
            volumes=volumes,
        )

    async def delete_snapshot_files(self, snapshot_id: str) -> None:
        await asyncio.to_thread(snapshot_files.delete, self._data_dir, snapshot_id)

    async def keep_files(self, name: str, *, hold: float = 0) -> int:
        del name, hold  # a pod's layer outlives it (persist: layer), or nothing is kept (none)
        return 0

    async def thaw_files(self, name: str) -> None:
        del name  # keep_files stops nothing here
