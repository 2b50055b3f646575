"""Starting one pod of a workload and discarding one: folders, limits, environment, command."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import time
from pathlib import Path

import structlog

from shared.errors import RuntimeFailure
from shared.runtime.local import bwrap, limits, procfs
from shared.runtime.local.records import PodRecord, WorkloadRecord
from shared.runtime.models import ENVD_PORT
from shared.runtime.templates import Template, load_template

log = structlog.get_logger()

ENV_ACCESS_TOKEN = "ENVD_ACCESS_TOKEN"  # noqa: S105 - a variable name, read by the daemon


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
        cgroup_parent: Path | None,
    ) -> None:
        self._data_dir = data_dir
        self._template_dirs = template_dirs
        self._bwrap = bwrap_path
        self._python = python
        self._stop_grace = stop_grace
        self._pycache = pycache
        self._cgroup_parent = cgroup_parent

    @property
    def pods_dir(self) -> Path:
        return self._data_dir / "pods"

    async def start(
        self, record: WorkloadRecord, uid: str
    ) -> tuple[PodRecord, asyncio.subprocess.Process]:
        """Spawn pod ``uid`` of ``record`` (not yet recorded anywhere)."""
        template = await asyncio.to_thread(load_template, record.template, self._template_dirs)
        pod_dir = self.pods_dir / uid
        workspace = pod_dir / "workspace"
        await asyncio.to_thread(workspace.mkdir, parents=True)
        mounts = []
        for volume in template.volumes:
            source = volume.resolve(self._data_dir, sandbox_id=record.name, owner=record.owner)
            await asyncio.to_thread(source.mkdir, parents=True, exist_ok=True)
            mounts.append(
                bwrap.Mount(source=source, target=volume.mount_path, read_only=volume.read_only)
            )
        launch = bwrap.PodLaunch(
            bwrap=self._bwrap,
            uid=uid,
            workload=record.name,
            runtime_root=self._data_dir,
            workspace=workspace,
            workdir=template.workdir,
            mounts=mounts,
            env=self._pod_env(template, record),
            command=self._command(template, record),
            code_dirs=await asyncio.to_thread(bwrap.code_dirs),
            hostname=record.name,
            pycache=self._pycache,
        )
        wanted = template.resources.limits
        pod_limits = limits.Limits(
            memory_bytes=wanted.memory_bytes,
            cpu_millis=wanted.cpu_millis,
            pids=wanted.pids,
            nofile=wanted.nofile,
        )
        cgroup = None
        if self._cgroup_parent is not None:
            cgroup = await asyncio.to_thread(
                limits.make_cgroup, self._cgroup_parent, uid, pod_limits
            )
        try:
            env_fd = await asyncio.to_thread(bwrap.open_env_file, pod_dir / "env.args", launch.env)
            try:
                argv = [
                    *limits.limit_wrapper(pod_limits, cgroup),
                    *bwrap.bwrap_argv(launch, env_fd=env_fd),
                ]
                process = await procfs.spawn(argv, pod_dir / "pod.log", pass_fds=[env_fd])
            finally:
                os.close(env_fd)
        except OSError as e:
            await asyncio.to_thread(remove_pod_dir, pod_dir)
            if self._cgroup_parent is not None:
                await asyncio.to_thread(limits.remove_cgroup, self._cgroup_parent / uid)
            msg = f"cannot start a pod for {record.name}: {e}"
            raise RuntimeFailure(msg) from e
        pod = PodRecord(uid=uid, pid=process.pid, started_at=time.time(), pod_dir=str(pod_dir))
        return pod, process

    async def cleanup(self, pod: PodRecord, *, keep_log_as: str | None = None) -> None:
        """Stop (if needed) and discard a pod: its workspace goes, like a container's disk."""
        await procfs.stop_pod(pod.uid, runtime_root=self._data_dir, grace=self._stop_grace)
        pod_dir = Path(pod.pod_dir)
        if keep_log_as is not None:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(
                    shutil.copyfile,
                    pod_dir / "pod.log",
                    self._data_dir / "logs" / f"{keep_log_as}.last.log",
                )
        await asyncio.to_thread(remove_pod_dir, pod_dir)
        if self._cgroup_parent is not None:
            await asyncio.to_thread(limits.remove_cgroup, self._cgroup_parent / pod.uid)

    async def scan(self) -> list[procfs.FoundPod]:
        """The running pods of this data dir (by any owner)."""
        return await asyncio.to_thread(procfs.scan_pods, self._data_dir)

    async def stop_stray(self, uid: str) -> None:
        """Stop a pod no record knows about and remove its folder."""
        await procfs.stop_pod(uid, runtime_root=self._data_dir, grace=self._stop_grace)
        await asyncio.to_thread(remove_pod_dir, self.pods_dir / uid)

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


def remove_pod_dir(pod_dir: Path) -> None:
    shutil.rmtree(pod_dir, ignore_errors=True)
