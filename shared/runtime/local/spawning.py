"""Spawning a pod's bwrap: its namespaces' ids are mapped and it joins its cgroups while it
waits, before anything of the sandbox runs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from shared.errors import RuntimeFailure
from shared.runtime.local import bwrap, limits, procfs, userns

_HANDSHAKE_TIMEOUT = 30.0
# Where each pod's private mount namespace stages its bind sources (see bwrap.stage_prefix).
STAGE_DIR = Path("/run/torpor-stage")


async def spawn(
    launch: bwrap.PodLaunch,
    pod_limits: limits.Limits,
    pod_dir: Path,
    enter: Sequence[str],
    *,
    cgroups: limits.Cgroups | None,
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
            *limits.rlimit_wrapper(pod_limits, cgroups=cgroups is not None),
            *stage,
            *bwrap.bwrap_argv(
                launch,
                env_fd=env_fd,
                userns=bwrap.UsernsFds(block=block_r, info=info_w),
                staged=staged,
            ),
        ]
        process = await procfs.spawn(argv, pod_dir / "pod.log", pass_fds=[env_fd, block_r, info_w])
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
        if cgroups is not None:
            await asyncio.to_thread(cgroups.join, launch.uid, [process.pid, child])
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
