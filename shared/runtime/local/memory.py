"""Memory-keeping pauses of the local runtime: the pod a scale to 0 stops is dumped by CRIU
(:mod:`.checkpoint`) before its teardown, and the next pod of the workload is that tree restored
instead of a fresh start (the scaler then replays nothing).

The images live with the sandbox's kept files, ``<data dir>/layers/<name>/memory`` (root's, in
the layer's 0700 folder; no pod ever mounts it), and go with them when the sandbox is deleted.
They are used once: a restore, whether it works or not, removes them. Nothing is lost in
silence: a pause that could not keep memory, or a restore that failed, leaves its reason
(``memory.note``), which the next pod carries to the resume report (``memory_note``); that pod
is then a fresh start, and the scaler replays the process list as for a files-only pause.

A pause keeps memory only when its workload says ``torpor.dev/pause-memory: true`` (set by
the snapshotter when the pause asked for it: E2B's pause body ``memory: true``), and not when
CRIU is not usable here or the template keeps no files (``persist: none``: the restored
processes' files would be gone). The scaler replays nothing into a restored pod
(``Endpoint.memory_kept``) and reports ``memoryKept: true``. A resume with
``torpor.dev/resume-memory: false`` (E2B's reboot) drops the images and starts fresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from shared.errors import RuntimeFailure
from shared.ports.workloads import ANNOTATION_PAUSE_MEMORY, ANNOTATION_RESUME_MEMORY
from shared.runtime.local import checkpoint, dumpable, procfs
from shared.runtime.local.launcher import PodLauncher
from shared.runtime.local.records import PodRecord, WorkloadRecord
from shared.runtime.templates import load_template

log = structlog.get_logger()

IMAGES = "memory"
_PARTIAL = "memory.partial"
NOTE = "memory.note"
_BOOT_ID = "torpor-boot-id"  # the dumped pod's boot id: a restored sandbox has not rebooted
_NOTE_BYTES = 1000


@dataclass(frozen=True)
class MemoryPauses:
    launcher: PodLauncher
    template_dirs: list[Path]
    checkpointer: checkpoint.Checkpointer | None
    unavailable: str  # why there is no checkpointer

    def images(self, name: str) -> Path:
        return self.launcher.layers.folder(name) / IMAGES

    def has_images(self, name: str) -> bool:
        return (self.images(name) / checkpoint.META).is_file()

    # ---- pause -------------------------------------------------------------------------

    async def dump(self, record: WorkloadRecord, pod: PodRecord, enter: Sequence[str]) -> None:
        """Dump ``pod`` (the pod a scale to 0 stops) when the pause wants memory; otherwise, or
        when the dump fails, leave the reason for the resume report. Never raises: the pause
        goes on keeping files either way."""
        folder = self.launcher.layers.folder(record.name)
        # Another process's reconciler may stop the same pod: one dumps, under a lock, while the
        # pod lives; the other then finds it gone and leaves the images and note alone.
        async with _locked(folder):
            if procfs.is_pod_alive(pod.pid, pod.uid, pod.start_ticks):
                await self._dump_or_note(record, pod, enter, folder)

    async def _dump_or_note(
        self, record: WorkloadRecord, pod: PodRecord, enter: Sequence[str], folder: Path
    ) -> None:
        await asyncio.to_thread(_remove, folder / IMAGES, folder / _PARTIAL, folder / NOTE)
        reason = await asyncio.to_thread(self._why_not, record)
        if reason is None:
            try:
                await self._dump(record, pod, enter)
                log.info("runtime_local_memory_dumped", workload=record.name, pod_uid=pod.uid)
                return
            except (checkpoint.CheckpointFailure, OSError) as e:
                reason = f"the pause could not dump it: {e}"
                log.warning("runtime_local_memory_dump_failed", workload=record.name, error=str(e))
                await asyncio.to_thread(_remove, folder / _PARTIAL)
        with contextlib.suppress(OSError):
            await asyncio.to_thread(_write_note, folder, reason)

    def _why_not(self, record: WorkloadRecord) -> str | None:
        wanted = record.annotations.get(ANNOTATION_PAUSE_MEMORY)
        if wanted == "false":
            return "the pause kept files only (memory: false)"
        if wanted != "true":  # not asked for (module docstring)
            return "the pause kept files only (memory was not asked for)"
        if self.checkpointer is None:
            return f"CRIU is not usable on this host: {self.unavailable}"
        try:
            template = load_template(record.template, self.template_dirs)
        except Exception as e:  # the template is gone: no start either
            return f"template {record.template} not found ({e})"
        if template.persist != "layer":
            return f"template {record.template} keeps no files (persist: none)"
        return None

    async def _dump(self, record: WorkloadRecord, pod: PodRecord, enter: Sequence[str]) -> None:
        assert self.checkpointer is not None
        if not procfs.is_pod_alive(pod.pid, pod.uid, pod.start_ticks):
            msg = "the pod was not running"
            raise checkpoint.CheckpointFailure(msg)
        # A started pod is recorded by its outer bwrap, a restored one by its PID 1.
        inner = pod.pid if _is_pid1(pod.pid) else procfs.inner_pid(pod.pid)
        if inner is None:
            msg = "the pod has no PID 1"
            raise checkpoint.CheckpointFailure(msg)
        folder = self.launcher.layers.folder(record.name)
        partial = folder / _PARTIAL
        boot_id = (await asyncio.to_thread((Path(pod.pod_dir) / "boot_id").read_text))[:64]
        if pod.memory_kept:
            # A restored PID 1 is not dumpable, which CRIU's dump cannot get past (.dumpable):
            # dumpable for the dump only. Sandbox code racing to trace it in that window would
            # make the dump fail (one tracer at a time), and the pause tears the pod down next.
            try:
                await asyncio.to_thread(dumpable.set_dumpable, inner, 1)
            except dumpable.DumpableFailure as e:
                raise checkpoint.CheckpointFailure(str(e)) from e
        await self.checkpointer.dump(
            checkpoint.PodTree(pid=inner, enter=enter),
            partial,
            identity={"sandbox": record.name, "pod": pod.uid},
        )
        await asyncio.to_thread(_write_private, partial / _BOOT_ID, boot_id)
        await asyncio.to_thread(os.rename, partial, folder / IMAGES)

    # ---- resume ------------------------------------------------------------------------

    def restorable_uid(self, record: WorkloadRecord) -> str | None:
        """The uid the next pod is restored as, or None when it starts fresh (no images, a
        reboot asked for, no CRIU): a fresh pod never takes the dumped pod's uid."""
        return None if self._why_no_restore(record) else self.pod_uid(record)

    def _why_no_restore(self, record: WorkloadRecord) -> str | None:
        """Why this resume does not even try the images it may have (else None)."""
        if record.annotations.get(ANNOTATION_RESUME_MEMORY) == "false":
            return "the resume booted from the kept files (memory: false)"
        if self.checkpointer is None:
            return f"CRIU is not usable on this host: {self.unavailable}"
        return None

    def pod_uid(self, record: WorkloadRecord) -> str | None:
        """The uid of the pod the images hold (it comes back as itself), if any."""
        with contextlib.suppress(OSError, ValueError, RuntimeFailure, AttributeError):
            meta = json.loads((self.images(record.name) / checkpoint.META).read_text())
            uid = meta["identity"]["pod"]
            if isinstance(uid, str) and procfs.valid_pod_uid(uid):
                return uid
        return None

    async def restore(
        self, record: WorkloadRecord, uid: str, enter: Sequence[str]
    ) -> tuple[PodRecord | None, str | None]:
        """The workload's next pod ``uid``: its paused tree restored (``(pod, None)``), or
        ``(None, why memory did not come back)`` for a fresh start, ``(None, None)`` when no
        pause tried to keep memory. The images are used once either way."""
        folder = self.launcher.layers.folder(record.name)
        note = await asyncio.to_thread(_take_note, folder)
        if not await asyncio.to_thread(self.has_images, record.name):
            await asyncio.to_thread(_remove, folder / IMAGES)
            return None, note
        images = folder / IMAGES
        try:
            why_not = self._why_no_restore(record)
            if why_not is not None:
                return None, why_not
            if self.checkpointer is None or self.pod_uid(record) != uid:
                return None, "the memory image is not this sandbox's pod's"
            try:
                boot_id = (await asyncio.to_thread((images / _BOOT_ID).read_text))[:64]
                pod = await self.launcher.restore(
                    record,
                    uid,
                    enter=enter,
                    images=images,
                    checkpointer=self.checkpointer,
                    identity={"sandbox": record.name, "pod": uid},
                    boot_id=boot_id,
                )
            except (checkpoint.CheckpointFailure, OSError) as e:
                log.warning(
                    "runtime_local_memory_restore_failed", workload=record.name, error=str(e)
                )
                return None, f"the restore failed: {e}"[:_NOTE_BYTES]
            log.info("runtime_local_memory_restored", workload=record.name, pod_uid=uid)
            return pod, None
        finally:
            await asyncio.to_thread(_remove, images)


@contextlib.asynccontextmanager
async def _locked(folder: Path) -> AsyncIterator[None]:
    if not await asyncio.to_thread(
        folder.is_dir
    ):  # no layer (persist: none): nothing to keep, nothing to race for
        yield
        return
    fd = await asyncio.to_thread(
        os.open, folder / ".memory.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
    )
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _is_pid1(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    nspid = next(
        (line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), []
    )
    return nspid[-1:] == ["1"] and len(nspid) > 1


def _remove(*paths: Path) -> None:
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _write_note(folder: Path, reason: str) -> None:
    if folder.is_dir():
        _write_private(folder / NOTE, reason[:_NOTE_BYTES])


def _take_note(folder: Path) -> str | None:
    path = folder / NOTE
    try:
        text = path.read_text()[:_NOTE_BYTES]
    except OSError:
        return None
    _remove(path)
    return text or None


def _write_private(path: Path, text: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
