"""Starting one pod of a workload and discarding one: folders, ids, limits, environment, command.

Only what the runtime itself created is ever acted on: pod folders are ``<data dir>/pods/<uuid>``
computed from a validated uuid (never a path read back from a record, which lives in a bucket
that is reachable over the network), volumes must resolve inside the data dir, and a pod's
processes are those in its cgroup plus the bwraps :mod:`.procfs` recognises by their place in the
PID namespace tree (not by a command line sandbox code could fake).

The parts: :mod:`.pod_commands` (environment, command line), :mod:`.spawning` (bwrap, ids,
cgroups) and :mod:`.pod_dirs` (the pod's root, its removal).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

import structlog

from shared.errors import RuntimeFailure
from shared.runtime.local import (
    beneath,
    bwrap,
    checkpoint,
    disk,
    etc,
    inject,
    limits,
    mounts,
    pod_dirs,
    podlog,
    procfs,
    spawning,
    template_layers,
    userns,
    volume_fs,
)
from shared.runtime.local.daemon_python import DaemonPython
from shared.runtime.local.layers import Layers, Persist
from shared.runtime.local.pod_commands import pod_command, pod_env
from shared.runtime.local.records import PodRecord, WorkloadRecord
from shared.runtime.templates import Template, load_template, template_version

log = structlog.get_logger()

SANDBOX_USER_ID = 1000  # `user` in the rootfs (deploy/sandbox-base/configure.sh)
# In a pod folder: which layer the pod holds, so whoever discards the pod (even as a stray after
# a restart) puts the right one back.
_LAYER_NOTE = "layer.json"
# cgroup ``cpu.weight`` of a warm pod until it is claimed (100: every other pod's).
POOL_CPU_WEIGHT = 10
# Each pod start is a boot of the sandbox: its own boot id, as a VM's (E2B's suite tells a
# cold resume from a memory restore by it). Without this every pod read the host's.
BOOT_ID = "/proc/sys/kernel/random/boot_id"
DEFAULT_CPU_WEIGHT = 100


class PodLauncher:
    def __init__(
        self,
        *,
        data_dir: Path,
        template_dirs: list[Path],
        bwrap_path: str,
        daemon: DaemonPython,
        stop_grace: float,
        pycache: Path,
        cgroups: limits.Cgroups | None,
        rootfs: Path,
        log_bytes: int = podlog.DEFAULT_CAP,
    ) -> None:
        self._data_dir = data_dir
        self._log_bytes = log_bytes
        self._rootfs = rootfs
        self.layers = Layers(data_dir)
        self._template_dirs = template_dirs
        self._bwrap = bwrap_path
        self._daemon = daemon
        self._stop_grace = stop_grace
        self._pycache = pycache
        self._cgroups = cgroups

    @property
    def pods_dir(self) -> Path:
        return self._data_dir / "pods"

    def pod_dir(self, uid: str) -> Path | None:
        """``<data dir>/pods/<uid>`` for a valid pod uid, else ``None``."""
        if not procfs.valid_pod_uid(uid):
            return None
        return self.pods_dir / uid

    async def start(
        self, record: WorkloadRecord, uid: str, *, enter: Sequence[str] = ()
    ) -> tuple[PodRecord, asyncio.subprocess.Process]:
        """Spawn pod ``uid`` of ``record`` (not yet recorded anywhere); ``enter`` is the argv
        prefix that puts it in its network namespace."""
        pod_dir, launch, pod_limits, version = await self._prepare(record, uid)
        try:
            process = await spawning.spawn(
                launch,
                pod_limits,
                pod_dir,
                enter,
                cgroups=self._cgroups,
                log_bytes=self._log_bytes,
            )
        except (OSError, RuntimeFailure) as e:
            await self._discard(uid, pod_dir)
            msg = f"cannot start a pod for {record.name}: {e}"
            raise RuntimeFailure(msg) from e
        pod = PodRecord(
            uid=uid,
            pid=process.pid,
            started_at=time.time(),
            pod_dir=str(pod_dir),
            start_ticks=procfs.start_ticks(process.pid),
            template_version=version,
        )
        return pod, process

    async def restore(
        self,
        record: WorkloadRecord,
        uid: str,
        *,
        enter: Sequence[str],
        images: Path,
        checkpointer: checkpoint.Checkpointer,
        identity: Mapping[str, str],
        boot_id: str,
    ) -> PodRecord:
        """Bring pod ``uid`` back from its checkpoint ``images``: its folders, layer, volumes and
        cgroups made as for a start (its boot id the dumped one's), then CRIU restores its tree
        into them instead of a spawn. Raises :class:`checkpoint.CheckpointFailure` (the pod is
        gone again then)."""
        pod_dir, launch, _, version = await self._prepare(record, uid, boot_id=boot_id)
        try:
            # Every bind source under the data dir is one this start made or opened safely
            # (a volume's checked dev:ino): the restore's stage refuses a swapped one.
            identities = {
                str(source): bwrap.identity(os.stat(source))
                for source in bwrap.bind_sources(launch)
                if bwrap.is_within(source, self._data_dir)
            }
            identities.update({str(k): v for k, v in bwrap.bind_identities(launch).items()})
            reader = await podlog.start_reader(pod_dir, self._log_bytes)
            try:
                target = checkpoint.RestoreTarget(
                    root=pod_dir / "root",
                    enter=enter,
                    output_fd=reader.fd,
                    identities=identities,
                    checked_dir=self._data_dir,
                )
                pid = await checkpointer.restore(target, images, identity=identity)
            finally:
                os.close(reader.fd)
            if self._cgroups is not None:
                await asyncio.to_thread(self._cgroups.join, uid, checkpoint.tree_pids(pid))
        except (OSError, RuntimeFailure) as e:
            with contextlib.suppress(RuntimeFailure):
                await self._stop(uid)
            await self._discard(uid, pod_dir)
            msg = f"cannot restore a pod for {record.name}: {e}"
            raise checkpoint.CheckpointFailure(msg) from e
        return PodRecord(
            uid=uid,
            pid=pid,
            started_at=time.time(),
            pod_dir=str(pod_dir),
            start_ticks=procfs.start_ticks(pid),
            template_version=version,
            memory_kept=True,
        )

    async def _prepare(
        self, record: WorkloadRecord, uid: str, *, boot_id: str | None = None
    ) -> tuple[Path, bwrap.PodLaunch, limits.Limits, str]:
        """Pod ``uid``'s folders, layer, root, volumes, cgroups and launch: all but its
        processes. Undone on failure."""
        template = await asyncio.to_thread(load_template, record.template, self._template_dirs)
        pod_dir = self.pod_dir(uid)
        if pod_dir is None or record.id_base is None or not userns.valid_base(record.id_base):
            msg = f"cannot start a pod for {record.name}: invalid pod uid or id range"
            raise RuntimeFailure(msg)
        base = record.id_base
        env = pod_env(template, record)
        bwrap.check_env(env)
        wanted = template.resources.limits
        pod_limits = limits.Limits(
            memory_bytes=wanted.memory_bytes,
            cpu_millis=wanted.cpu_millis,
            pids=wanted.pids,
            nofile=wanted.nofile,
            disk_bytes=wanted.disk_bytes,
        )
        persist = Persist(template.persist)
        try:
            if record.pool is not None:  # a warm pod's disk is always fresh
                await asyncio.to_thread(self.layers.delete, record.name)
            await asyncio.to_thread(pod_dir.mkdir, 0o700)
            await asyncio.to_thread(
                (pod_dir / _LAYER_NOTE).write_text,
                json.dumps({"name": record.name, "persist": persist.value}),
            )
            layer = await asyncio.to_thread(
                self.layers.open,
                record.name,
                base=base,
                disk_bytes=pod_limits.disk_bytes,
                persist=persist,
                holder=uid,
            )
            root = pod_dir / "root"
            lowers = [template_layers.tree(self._data_dir, key) for key in template.layers]
            await asyncio.to_thread(pod_dirs.mount_root, self._rootfs, layer, pod_dir, base, lowers)
            # A warm pod gets the sandbox's volumes when it is claimed (see .pools).
            volumes = (
                []
                if record.pool is not None
                else await asyncio.to_thread(self._volumes, template, record, base)
            )
            files = await asyncio.to_thread(pod_dirs.mount_files, pod_dir)
            await asyncio.to_thread(
                etc.write_etc,
                files / "etc",
                hostname=record.name,
                address=record.address,
                accounts=False,
            )
            # The runtime's record of it (a memory pause reads it back), and the pod's copy.
            boot_id = boot_id or f"{uuid.uuid4()}\n"
            await asyncio.to_thread((pod_dir / "boot_id").write_text, boot_id)
            boot_id_file = files / "boot_id"
            await asyncio.to_thread(boot_id_file.write_text, boot_id)
            await asyncio.to_thread(boot_id_file.chmod, 0o444)
            envd, package_init = await asyncio.to_thread(bwrap.daemon_package)
            daemon = await asyncio.to_thread(
                pod_dirs.mount_daemon, pod_dir, envd, package_init, self._pycache, self._daemon
            )
            launch = bwrap.PodLaunch(
                bwrap=self._bwrap,
                uid=uid,
                workload=record.name,
                runtime_root=self._data_dir,
                workspace=root,
                workdir=template.workdir,
                mounts=[*volumes, bwrap.Mount(boot_id_file, BOOT_ID, read_only=True)],
                env=env,
                command=pod_command(template, record, python=self._daemon.executable),
                code_dirs=(),
                hostname=record.name,
                id_base=base,
                etc_dir=files / "etc",
                tmp_size=pod_limits.disk_bytes,
                root=root,
                capabilities=bwrap.CAPABILITIES,
                daemon_binds=daemon,
            )
            if self._cgroups is not None:
                await asyncio.to_thread(self._cgroups.create, uid, pod_limits)
                if record.pool is not None:  # a warm pod yields the CPU to sandboxes
                    await asyncio.to_thread(self._cgroups.set_cpu_weight, uid, POOL_CPU_WEIGHT)
        except (OSError, RuntimeFailure) as e:
            await self._discard(uid, pod_dir)
            msg = f"cannot start a pod for {record.name}: {e}"
            raise RuntimeFailure(msg) from e
        return pod_dir, launch, pod_limits, template_version(template)

    def note_layer(self, uid: str, name: str, persist: Persist) -> None:
        """Pod ``uid`` holds workload ``name``'s layer now (a claimed warm pod, see .pools)."""
        pod_dir = self.pod_dir(uid)
        assert pod_dir is not None
        note = pod_dir / _LAYER_NOTE
        partial = note.with_suffix(".partial")
        partial.write_text(json.dumps({"name": name, "persist": persist.value}))
        os.rename(partial, note)

    def switch_layer(
        self,
        uid: str,
        inner: int,
        *,
        pool: str,
        name: str,
        old_base: int,
        new_base: int,
        disk_bytes: int | None,
    ) -> None:
        """Give running pod ``uid`` (a warm pod of ``pool``, PID 1 ``inner``) workload
        ``name``'s kept layer as its root: the layer's files take the pod's ids, the rootfs
        goes under it and the pod's processes move onto it (:func:`.inject.switch_root`); the
        pool's own layer goes. Repeatable after a crash."""
        pod_dir = self.pod_dir(uid)
        assert pod_dir is not None
        mnt = self.layers.open(
            name, base=old_base, disk_bytes=disk_bytes, persist=Persist.LAYER, holder=uid
        )
        self.layers.reown(name, old_base=old_base, new_base=new_base)
        if not pod_dirs.root_upper_is(inner, pod_dir, mnt / "upper"):
            root = pod_dir / "root"
            mounts.unmount(root)
            pod_dirs.mount_pod_root([pod_dir / "lower"], mnt / "upper", mnt / "work", pod_dir)
            inject.switch_root(inner, root, owner=new_base)
        self.note_layer(uid, name, Persist.LAYER)
        self.layers.delete(pool)

    def claimed(self, uid: str) -> None:
        """A warm pod serves a sandbox now: the CPU weight of any pod."""
        if self._cgroups is not None:
            self._cgroups.set_cpu_weight(uid, DEFAULT_CPU_WEIGHT)

    def held_layer(self, uid: str) -> str | None:
        """The workload whose layer pod ``uid`` holds, from its note."""
        pod_dir = self.pod_dir(uid)
        try:
            assert pod_dir is not None
            return str(json.loads((pod_dir / _LAYER_NOTE).read_text())["name"])
        except (AssertionError, OSError, ValueError, KeyError, TypeError):
            return None

    def volumes(self, template: Template, record: WorkloadRecord, base: int) -> list[bwrap.Mount]:
        """The template's volumes for ``record``, made and given to its ids."""
        return self._volumes(template, record, base)

    def _volumes(self, template: Template, record: WorkloadRecord, base: int) -> list[bwrap.Mount]:
        mounts = []
        for volume in template.volumes:
            source = volume.resolve(self._data_dir, sandbox_id=record.name, owner=record.owner)
            inside = not Path(volume.host_path).is_absolute()
            if inside and not bwrap.is_within(source, self._data_dir):
                msg = f"volume {volume.name} of {record.name} resolves outside the data dir"
                raise RuntimeFailure(msg)
            identity = None
            if inside:
                identity = self._open_volume(source, base)
            else:  # an operator's absolute host path: by path, and it keeps its owner
                source.mkdir(parents=True, exist_ok=True, mode=0o755)
            mounts.append(
                bwrap.Mount(
                    source=source,
                    target=volume.mount_path,
                    read_only=volume.read_only,
                    identity=identity,
                )
            )
        return mounts

    def _open_volume(self, source: Path, base: int) -> str:
        """Make and re-own a volume folder beneath the data dir, never through a symlink: a
        sandbox of a template that mounts a parent folder (``volumes/{owner}``) can swap the
        names in it. Its ``dev:ino``, which the folder bound into the pod must have."""
        relative = PurePosixPath(source.relative_to(self._data_dir))
        top = self._data_dir
        if relative.parts[:1] == (volume_fs.FOLDER,) and len(relative.parts) > 1:
            # From the volumes' own filesystem (.volume_fs): the walk below crosses no mount.
            top, relative = volume_fs.root(self._data_dir), relative.relative_to(volume_fs.FOLDER)
        try:
            with beneath.Dir.open(top) as data:
                data.makedirs(relative)
                with data.dir(relative) as folder:  # ELOOP if a name on the way is a symlink
                    # The sandbox's `user` (1000), who runs commands by default, can write it;
                    # its root can anyway.
                    userns.chown_folder(folder, base, owner=SANDBOX_USER_ID)
                    return bwrap.identity(os.fstat(folder.fd))
        except OSError as e:
            msg = f"volume folder {relative} is not a folder beneath the data dir: {e.strerror}"
            raise RuntimeFailure(msg) from e

    async def cleanup(self, pod: PodRecord) -> None:
        """Stop (if needed) and discard a pod: its workspace goes, like a container's disk.

        Raises ``RuntimeFailure`` when a process of the pod survived, so the caller keeps the
        pod on its list and tries again instead of forgetting a running pod."""
        pod_dir = self.pod_dir(pod.uid)
        if pod_dir is None:
            log.error("runtime_local_invalid_pod_uid", pod_uid=pod.uid[:80])
            return
        await self._stop(pod.uid)
        await self._discard(pod.uid, pod_dir)

    async def keep_log(self, pod: PodRecord, name: str) -> None:
        """Keep a dead pod's log as ``logs/<name>.last.log`` (its folder goes with it): its
        last bytes, at most the pod log's cap."""
        pod_dir = self.pod_dir(pod.uid)
        if pod_dir is not None:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(
                    podlog.keep_copy,
                    pod_dir,
                    self._data_dir / "logs" / f"{name}.last.log",
                    self._log_bytes,
                )

    async def _stop(self, uid: str) -> None:
        await procfs.stop_pod(uid, runtime_root=self._data_dir, grace=self._stop_grace)
        if self._cgroups is not None and not await asyncio.to_thread(self._cgroups.kill, uid):
            msg = f"processes of pod {uid} survived SIGKILL"
            raise RuntimeFailure(msg)

    async def _discard(self, uid: str, pod_dir: Path) -> None:
        await asyncio.to_thread(disk.unmount_workspace, pod_dir)
        await asyncio.to_thread(self._put_back_layer, uid, pod_dir)
        await asyncio.to_thread(pod_dirs.remove_pod_dir, pod_dir)
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.remove, uid)

    def _put_back_layer(self, uid: str, pod_dir: Path) -> None:
        """Unmount the pod's root and give its layer back (kept, or deleted for ``persist:
        none``)."""
        mounts.unmount(pod_dir / "root")
        mounts.unmount(pod_dir / "lower")
        for extra in pod_dirs.template_lowers(pod_dir):
            mounts.unmount(extra)
        for mounted in [pod_dirs.files_dir(pod_dir), *pod_dirs.read_only_mounts(pod_dir)]:
            mounts.unmount(mounted)
        try:
            note = json.loads((pod_dir / _LAYER_NOTE).read_text())
            name, persist = str(note["name"]), Persist(note["persist"])
        except (OSError, ValueError, KeyError, TypeError):
            return  # the pod never got a layer
        self.layers.close(name, persist=persist, holder=uid)

    async def delete_layer(self, name: str) -> None:
        """The workload is gone (kill, retention): its kept files go too."""
        await asyncio.to_thread(self.layers.delete, name)

    async def close(self) -> None:
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.remove_instance)

    async def scan(self) -> set[str]:
        """Uids of this data dir's pods that run or left something behind (by any owner)."""
        found = {p.uid for p in await asyncio.to_thread(procfs.scan_pods, self._data_dir)}
        if self._cgroups is not None:
            found |= await asyncio.to_thread(self._cgroups.pod_uids)
        found |= await asyncio.to_thread(self._pod_dirs)
        return {uid for uid in found if procfs.valid_pod_uid(uid)}

    def _pod_dirs(self) -> set[str]:
        try:
            entries = list(os.scandir(self.pods_dir))
        except OSError:
            return set()
        return {e.name for e in entries if e.is_dir(follow_symlinks=False)}

    async def stop_stray(self, uid: str) -> None:
        """Stop a pod no record knows about and remove what it left."""
        pod_dir = self.pod_dir(uid)
        if pod_dir is None:
            return
        await self._stop(uid)
        await self._discard(uid, pod_dir)
