"""Starting one pod of a workload and discarding one: folders, ids, limits, environment, command.

Only what the runtime itself created is ever acted on: pod folders are ``<data dir>/pods/<uuid>``
computed from a validated uuid (never a path read back from a record, which lives in a bucket
that is reachable over the network), volumes must resolve inside the data dir, and a pod's
processes are those in its cgroup plus the bwraps :mod:`.procfs` recognises by their place in the
PID namespace tree (not by a command line sandbox code could fake).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import stat
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import structlog

from shared.errors import RuntimeFailure
from shared.runtime.local import bwrap, disk, etc, limits, procfs, userns
from shared.runtime.local.records import PodRecord, WorkloadRecord
from shared.runtime.models import ENVD_PORT
from shared.runtime.templates import Template, load_template

log = structlog.get_logger()

ENV_ACCESS_TOKEN = "ENVD_ACCESS_TOKEN"  # noqa: S105 - a variable name, read by the daemon
_HANDSHAKE_TIMEOUT = 30.0
# Where each pod's private mount namespace stages its bind sources (see bwrap.stage_prefix).
STAGE_DIR = Path("/run/torpor-stage")


class PodLauncher:
    def __init__(
        self,
        *,
        data_dir: Path,
        template_dirs: list[Path],
        bwrap_path: str,
        python: str,
        stop_grace: float,
        pycache: Path,
        cgroups: limits.Cgroups | None,
    ) -> None:
        self._data_dir = data_dir
        self._template_dirs = template_dirs
        self._bwrap = bwrap_path
        self._python = python
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
        template = await asyncio.to_thread(load_template, record.template, self._template_dirs)
        pod_dir = self.pod_dir(uid)
        if pod_dir is None or record.id_base is None or not userns.valid_base(record.id_base):
            msg = f"cannot start a pod for {record.name}: invalid pod uid or id range"
            raise RuntimeFailure(msg)
        base = record.id_base
        env = self._pod_env(template, record)
        bwrap.check_env(env)
        wanted = template.resources.limits
        pod_limits = limits.Limits(
            memory_bytes=wanted.memory_bytes,
            cpu_millis=wanted.cpu_millis,
            pids=wanted.pids,
            nofile=wanted.nofile,
            disk_bytes=wanted.disk_bytes,
        )
        try:
            await asyncio.to_thread(pod_dir.mkdir, 0o700)
            workspace = pod_dir / "workspace"
            await asyncio.to_thread(workspace.mkdir, 0o755)
            if pod_limits.disk_bytes is not None:
                await asyncio.to_thread(
                    disk.mount_workspace, workspace, size=pod_limits.disk_bytes, owner=base
                )
            else:
                await asyncio.to_thread(os.chown, workspace, base, base)
            mounts = await asyncio.to_thread(self._volumes, template, record, base)
            await asyncio.to_thread(
                etc.write_etc, pod_dir / "etc", hostname=record.name, address=record.address
            )
            launch = bwrap.PodLaunch(
                bwrap=self._bwrap,
                uid=uid,
                workload=record.name,
                runtime_root=self._data_dir,
                workspace=workspace,
                workdir=template.workdir,
                mounts=mounts,
                env=env,
                command=self._command(template, record),
                code_dirs=await asyncio.to_thread(bwrap.code_dirs),
                hostname=record.name,
                pycache=self._pycache,
                id_base=base,
                etc_dir=pod_dir / "etc",
                tmp_size=pod_limits.disk_bytes,
            )
            if self._cgroups is not None:
                await asyncio.to_thread(self._cgroups.create, uid, pod_limits)
            process = await self._spawn(launch, pod_limits, pod_dir, enter)
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
        )
        return pod, process

    async def _spawn(
        self,
        launch: bwrap.PodLaunch,
        pod_limits: limits.Limits,
        pod_dir: Path,
        enter: Sequence[str],
    ) -> asyncio.subprocess.Process:
        """Start bwrap, then (while it waits) map its ids and put it in its cgroups."""
        assert launch.id_base is not None
        stage, staged = bwrap.stage_prefix(STAGE_DIR, bwrap.bind_sources(launch))
        env_fd = await asyncio.to_thread(bwrap.open_env_file, pod_dir / "env.args", launch.env)
        block_r, block_w = os.pipe()
        info_r, info_w = os.pipe()
        try:
            argv = [
                *enter,
                *limits.rlimit_wrapper(pod_limits, cgroups=self._cgroups is not None),
                *stage,
                *bwrap.bwrap_argv(
                    launch,
                    env_fd=env_fd,
                    userns=bwrap.UsernsFds(block=block_r, info=info_w),
                    staged=staged,
                ),
            ]
            process = await procfs.spawn(
                argv, pod_dir / "pod.log", pass_fds=[env_fd, block_r, info_w]
            )
        finally:
            for fd in (env_fd, block_r, info_w):
                os.close(fd)
        child: object = None
        try:
            info = await asyncio.wait_for(
                asyncio.to_thread(_read_info, info_r), timeout=_HANDSHAKE_TIMEOUT
            )
            child = info.get("child-pid")
            if not isinstance(child, int):
                msg = f"bwrap exited before its sandbox started{_log_tail(pod_dir)}"
                raise RuntimeFailure(msg)
            await asyncio.to_thread(userns.write_maps, child, launch.id_base)
            await userns.forbid_nested(child)
            if self._cgroups is not None:
                await asyncio.to_thread(self._cgroups.join, launch.uid, [process.pid, child])
            os.write(block_w, b"1")  # nothing of the sandbox ran before this
        except BaseException:
            for pid in (process.pid, child):
                if isinstance(pid, int):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, 9)
            await process.wait()
            raise
        finally:
            os.close(info_r)
            os.close(block_w)
        return process

    def _volumes(self, template: Template, record: WorkloadRecord, base: int) -> list[bwrap.Mount]:
        mounts = []
        for volume in template.volumes:
            source = volume.resolve(self._data_dir, sandbox_id=record.name, owner=record.owner)
            inside = not Path(volume.host_path).is_absolute()
            if inside and not bwrap.is_within(source, self._data_dir):
                msg = f"volume {volume.name} of {record.name} resolves outside the data dir"
                raise RuntimeFailure(msg)
            source.mkdir(parents=True, exist_ok=True, mode=0o755)
            if inside:  # an operator's absolute host path keeps its owner
                userns.chown_tree(source, base)
            mounts.append(
                bwrap.Mount(source=source, target=volume.mount_path, read_only=volume.read_only)
            )
        return mounts

    async def cleanup(self, pod: PodRecord) -> None:
        """Stop (if needed) and discard a pod: its workspace goes, like a container's disk.

        Raises ``RuntimeFailure`` when a process of the pod survived, so the caller keeps the
        pod on its list and tries again instead of forgetting a running pod."""
        pod_dir = self.pod_dir(pod.uid)
        if pod_dir is None:
            log.error("runtime.local.invalid_pod_uid", pod_uid=pod.uid[:80])
            return
        await self._stop(pod.uid)
        await self._discard(pod.uid, pod_dir)

    async def keep_log(self, pod: PodRecord, name: str) -> None:
        """Keep a dead pod's log as ``logs/<name>.last.log`` (its folder goes with it)."""
        pod_dir = self.pod_dir(pod.uid)
        if pod_dir is not None:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(
                    shutil.copyfile,
                    pod_dir / "pod.log",
                    self._data_dir / "logs" / f"{name}.last.log",
                )

    async def _stop(self, uid: str) -> None:
        await procfs.stop_pod(uid, runtime_root=self._data_dir, grace=self._stop_grace)
        if self._cgroups is not None and not await asyncio.to_thread(self._cgroups.kill, uid):
            msg = f"processes of pod {uid} survived SIGKILL"
            raise RuntimeFailure(msg)

    async def _discard(self, uid: str, pod_dir: Path) -> None:
        await asyncio.to_thread(disk.unmount_workspace, pod_dir)
        await asyncio.to_thread(remove_pod_dir, pod_dir)
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.remove, uid)

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

    def _pod_env(self, template: Template, record: WorkloadRecord) -> dict[str, str]:
        system_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        path = f"{Path(sys.base_prefix) / 'bin'}:{system_path}"
        env = {
            "PATH": path,
            **template.env,
            **record.envs,
            "E2B_SANDBOX": "true",
            "E2B_SANDBOX_ID": record.name,
        }
        if record.access_token:
            # Not ``--access-token`` in argv: visible in ``ps``, and a token starting with "-"
            # would be read as an option. The daemon drops it from the environment it hands on.
            env[ENV_ACCESS_TOKEN] = record.access_token
        return env

    def _command(self, template: Template, record: WorkloadRecord) -> list[str]:
        if template.command is not None:
            values = {
                "python": self._python,
                "host": record.address,
                "port": str(ENVD_PORT),
                "root": "/workspace",
            }
            return [part.format(**values) for part in template.command]
        return [
            self._python,
            "-X",
            f"pycache_prefix={self._pycache}",
            "-m",
            "services.envd",
            "--listen",
            f"{record.address}:{ENVD_PORT}",
            "--root",
            "/workspace",
        ]


def _read_info(fd: int) -> dict[str, object]:
    """bwrap's ``--info-fd`` JSON (``{}`` when bwrap exited first)."""
    data = b""
    while True:
        try:
            return dict(json.loads(data))
        except ValueError:
            pass
        chunk = os.read(fd, 4096)
        if not chunk:
            return {}
        data += chunk


def _log_tail(pod_dir: Path) -> str:
    with contextlib.suppress(OSError):
        lines = (pod_dir / "pod.log").read_text(errors="replace").strip().splitlines()
        if lines:
            return f" ({lines[-1][:300]})"
    return ""


def remove_pod_dir(pod_dir: Path) -> None:
    """Remove a pod folder, never following a symlink (rmtree's fd-based walk does not)."""
    try:
        st = os.lstat(pod_dir)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        log.error("runtime.local.pod_dir_not_a_folder", pod_dir=str(pod_dir))
        return
    if os.path.ismount(pod_dir / "workspace"):
        log.error("runtime.local.workspace_still_mounted", pod_dir=str(pod_dir))
        return
    shutil.rmtree(pod_dir, ignore_errors=True)
