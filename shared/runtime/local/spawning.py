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
from shared.runtime.local import bwrap, limits, podlog, procfs, userns

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
    log_bytes: int = podlog.DEFAULT_CAP,
) -> asyncio.subprocess.Process:
    """Start bwrap, then (while it waits) map its ids and put it in its cgroups."""
    assert launch.id_base is not None
    stage, staged = bwrap.stage_prefix(
        STAGE_DIR, bwrap.bind_sources(launch), bwrap.bind_identities(launch)
    )
    block_r, block_w = os.pipe2(os.O_CLOEXEC)
    info_r, info_w = os.pipe2(os.O_CLOEXEC)
    fds = [block_r, info_w]
    try:
        userns_fds = bwrap.UsernsFds(block=block_r, info=info_w)
        # The options' descriptor number must be in argv before the file exists: the next free
        # one, held by a placeholder until the file takes it.
        placeholder = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        fds.append(placeholder)
        inner, options = bwrap.hidden_argv(launch, placeholder, userns=userns_fds, staged=staged)
        args_fd = await asyncio.to_thread(bwrap.open_args_file, pod_dir / "bwrap.args", options)
        os.dup2(args_fd, placeholder)
        os.close(args_fd)
        reader = await podlog.start_reader(pod_dir, log_bytes)
        fds.append(reader.fd)
        argv = [*enter, *limits.rlimit_wrapper(pod_limits, cgroups=cgroups is not None)]
        argv += [*stage, *inner]
        process = await procfs.spawn(argv, fds[-1], pass_fds=fds[:3])
    finally:
        for fd in fds:
            os.close(fd)
    child: object = None
    try:
        info = await asyncio.wait_for(
            asyncio.to_thread(_read_info, info_r), timeout=_HANDSHAKE_TIMEOUT
        )
        child = info.get("child-pid")
        if not isinstance(child, int):
            await reader.drained(within=2.0)  # what bwrap said, before it is read back
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
    line = podlog.last_line(pod_dir)
    return f" ({line[:300]})" if line else ""
