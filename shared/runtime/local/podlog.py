"""A pod's output (PID 1's and its daemon's stdout/stderr): a pipe, read on the host by a small
reader process that keeps only the last ``cap`` bytes, and tails read with a byte bound.

Nothing inside a sandbox holds a descriptor of a host file: the pod writes into a pipe, and the
reader (its own session, outside the pod's cgroup and namespaces, so it outlives a restarted
runtime like the pod does) writes ``pod.log`` and rotates it into ``pod.log.1`` at half the cap,
so both together never exceed it, however much the pod writes. It exits when the pipe's last
writer (the pod's last process) is gone. It never stops reading: a full disk or a removed pod
folder drops bytes, it never blocks the pod.

The reader is :mod:`.podlog_reader` run as a script by the runtime's interpreter in isolated
mode (``-I -S``): it imports nothing but ``os`` and ``sys``, so it starts in milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

LOG = "pod.log"
OLDER = LOG + ".1"  # the previous half, after a rotation
DEFAULT_CAP = 8 * 2**20  # bytes kept per pod (both files), TORPOR_POD_LOG_BYTES
_READER = str(Path(__file__).with_name("podlog_reader.py"))
_readers: set[asyncio.Task[None]] = set()  # keeps each reader's reaping task alive


@dataclass(frozen=True)
class Reader:
    fd: int  # the pipe's write end: the pod's stdout and stderr (the caller closes its copy)
    process: asyncio.subprocess.Process

    async def drained(self, *, within: float) -> None:
        """Wait until the reader wrote everything (the pod's last writer is gone)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.process.wait()), within)


async def start_reader(pod_dir: Path, cap: int) -> Reader:
    """Start the reader of pod ``pod_dir``'s output."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            _READER,
            str(pod_dir),
            str(cap),
            stdin=read_end,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            env={},
            start_new_session=True,  # survives the runtime, as the pod does
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    task = asyncio.get_running_loop().create_task(_reap(proc))
    _readers.add(task)
    task.add_done_callback(_readers.discard)
    return Reader(write_end, proc)


async def _reap(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(Exception):
        await proc.wait()


def tail(pod_dir: Path, limit: int, *, name: str = LOG) -> str:
    """The last ``limit`` bytes of the pod's output (across the rotation), decoded leniently.
    Reads at most ``limit`` bytes; never follows a link planted in the folder."""
    parts: list[bytes] = []
    want = limit
    for file in (name, name + ".1"):  # the newest part first
        if want <= 0:
            break
        data = _read_end(pod_dir / file, want)
        parts.insert(0, data)
        want -= len(data)
    return b"".join(parts).decode(errors="replace")


def last_line(pod_dir: Path, limit: int = 4096, *, name: str = LOG) -> str:
    """The last non-empty line of the pod's output (its last ``limit`` bytes), or ``""``."""
    lines = tail(pod_dir, limit, name=name).strip().splitlines()
    return lines[-1] if lines else ""


def _read_end(path: Path, limit: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return b""
        return os.pread(fd, limit, max(0, st.st_size - limit))
    except OSError:
        return b""
    finally:
        os.close(fd)


def keep_copy(pod_dir: Path, dest: Path, cap: int) -> None:
    """Write the pod's last ``cap`` bytes of output to ``dest`` (a dead pod's log, kept after
    its folder goes): bounded like the log itself."""
    data = tail(pod_dir, cap).encode(errors="replace")[-cap:]
    partial = dest.with_name(dest.name + ".partial")
    fd = os.open(
        partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(partial, dest)
