"""A pod's ``/workspace`` with a size limit: a sparse ext4 image, loop-mounted on the host.

The template's ``resources.limits.disk`` becomes the image's size: a write past it fails with
ENOSPC inside the sandbox while the host's data dir filesystem stays untouched (the image is
sparse: it takes only what is written). The mount is on the host (``<pod dir>/workspace``), so
the runtime and tests see the files, and it is bound into the pod like the plain folder it
replaces. Its root belongs to the pod's root (host uid ``id_base``). ``nosuid,nodev``: nothing
on it can raise privileges on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

from shared.errors import RuntimeFailure
from shared.runtime.local.procfs import SPAWN_ENV

IMAGE = "workspace.img"


async def _run(*argv: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=SPAWN_ENV,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        msg = f"{argv[0]} failed: {out.decode(errors='replace').strip()[-300:]}"
        raise RuntimeFailure(msg)


async def mount_workspace(pod_dir: Path, workspace: Path, *, size: int, owner: int) -> None:
    """Create ``workspace`` as a mounted ext4 of ``size`` bytes whose root ``owner`` owns."""
    image = pod_dir / IMAGE
    fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    # No journal, lazy init: a second or two less per pod; the workspace dies with the pod.
    await _run(
        "mkfs.ext4",
        "-q",
        "-F",
        "-O",
        "^has_journal",
        "-E",
        f"lazy_itable_init=1,root_owner={owner}:{owner}",
        "-m",
        "0",
        str(image),
    )
    await _run("mount", "-o", "loop,nosuid,nodev,noatime", str(image), str(workspace))
    with contextlib.suppress(OSError):
        (workspace / "lost+found").rmdir()


async def unmount_workspace(pod_dir: Path) -> None:
    """Unmount (lazily if still busy) and drop the image; a no-op for a plain folder."""
    workspace = pod_dir / "workspace"
    if await asyncio.to_thread(os.path.ismount, workspace):
        try:
            await _run("umount", str(workspace))
        except RuntimeFailure:
            await _run("umount", "-l", str(workspace))
    with contextlib.suppress(FileNotFoundError):
        (pod_dir / IMAGE).unlink()
