"""Sandbox root is not host root: each workload's pods run in a user namespace mapped to its own
range of unprivileged host ids.

Uid (and gid) 0..65535 inside a pod map to ``base``..``base+65535`` on the host, so root in a
sandbox is an ordinary host user with no capabilities outside its namespaces, and a later
``user`` (uid 1000 inside) is ``base+1000`` outside. The range belongs to the workload, not the
pod, so files in its volumes keep their owners across pauses; two workloads never share one,
so their processes cannot signal or ptrace each other even across an escape of the PID namespace.

How: bubblewrap creates the user namespace (``--unshare-user``) while running as the range's
host uid (so the namespace's files can be created), then waits (``--userns-block-fd``) until the
runtime, as root, has written ``/proc/<child>/uid_map`` and ``gid_map`` with the whole range
(an unprivileged bwrap could map only its own id, and ``newuidmap`` is not installed everywhere)
and has put the pod in its cgroups. Nothing inside the sandbox runs before that.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import stat
import time
from pathlib import Path

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from shared.bus.kv import key_names
from shared.errors import RuntimeFailure
from shared.runtime.local import beneath
from shared.runtime.local.records import reservation_holder, reservation_of, reservation_value

IDS_PER_POD = 65536
FIRST_BASE = 1 << 30  # far above the ids of real host users and of subuid ranges (100000+)
RANGES = ((1 << 32) - FIRST_BASE) // IDS_PER_POD - 1  # the last range would reach 2^32-1
RANGE_PREFIX = "ids."


def range_key(base: int) -> str:
    return f"{RANGE_PREFIX}{base}"


class IdRangePool:
    """Host id ranges reserved in the workloads' KV bucket, one per workload."""

    def __init__(self, kv: KeyValue, *, instance: str) -> None:
        self._kv = kv
        # Runtimes with different buckets (separate instances on one host) start their search
        # at different places, so they rarely probe the same ranges.
        self._start = int(hashlib.sha256(instance.encode()).hexdigest(), 16) % RANGES

    async def reserve(self, name: str) -> int:
        taken = set(await self.reserved())
        for step in range(RANGES):
            base = FIRST_BASE + ((self._start + step) % RANGES) * IDS_PER_POD
            if base in taken:
                continue
            try:
                await self._kv.create(range_key(base), reservation_value(name))
            except KeyWrongLastSequenceError:
                continue
            return base
        msg = "no free host id range left for a local pod"
        raise RuntimeFailure(msg)

    async def release(self, base: int) -> None:
        with contextlib.suppress(KeyNotFoundError):
            await self._kv.purge(range_key(base))

    async def transfer(self, base: int, name: str) -> None:
        """Workload ``name`` holds range ``base`` now (a warm pod claimed with its ids)."""
        await self._kv.put(range_key(base), reservation_value(name))

    async def release_held(self, base: int, name: str) -> None:
        """Release range ``base`` only while ``name`` holds it (safe to repeat)."""
        if await self.holder(base) == name:
            await self.release(base)

    async def holder(self, base: int) -> str | None:
        return await reservation_holder(self._kv, range_key(base))

    async def reserved(self) -> list[int]:
        return [b for b in await self._candidates() if await self.holder(b) is not None]

    async def _candidates(self) -> list[int]:
        """Range bases with a key (some may be purged tombstones)."""
        keys = await key_names(self._kv)
        return sorted(int(k.removeprefix(RANGE_PREFIX)) for k in keys if k.startswith(RANGE_PREFIX))

    async def release_orphans(self, names: set[str]) -> None:
        """As :meth:`.addresses.AddressPool.release_orphans`: a range reserved a moment ago
        by a create under way elsewhere is kept (two workloads on one range could signal
        each other)."""
        now = time.time()
        for base in await self._candidates():
            reservation = await reservation_of(self._kv, range_key(base))
            if reservation is not None and reservation.is_left_over(names, now):
                await self.release(base)


def valid_base(base: int) -> bool:
    return base >= FIRST_BASE and (base - FIRST_BASE) % IDS_PER_POD == 0 and base < 1 << 32


def write_maps(child_pid: int, base: int) -> None:
    """Map ids 0..65535 of the pod's user namespace to ``base``.. on the host (as root)."""
    if not valid_base(base):
        msg = f"invalid host id range {base}"
        raise RuntimeFailure(msg)
    line = f"0 {base} {IDS_PER_POD}\n"
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{child_pid}/{name}", "w") as f:
            f.write(line)


async def forbid_nested(child_pid: int) -> None:
    """No user namespaces inside the pod's: each would hand sandbox code every capability again
    (over its own namespaces), the usual door to kernel bugs. ``user.max_user_namespaces`` is
    per user namespace, so it is written from inside it (bwrap's ``--disable-userns`` cannot be
    combined with the externally mapped namespace)."""
    proc = await asyncio.create_subprocess_exec(
        "nsenter",
        f"--user=/proc/{child_pid}/ns/user",
        "--",
        "/bin/sh",
        "-c",
        "echo 0 > /proc/sys/user/max_user_namespaces",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        msg = f"cannot forbid nested user namespaces: {out.decode(errors='replace').strip()}"
        raise RuntimeFailure(msg)


def chown_tree(root: Path, base: int, *, owner: int = 0) -> None:
    """Give a host folder to the pod's uid ``owner`` (host uid ``base + owner``; the sandbox's
    ``user`` is 1000): the folder itself always, its content only when the folder belongs to
    someone else (a volume of an older id scheme). Never follows symlinks (a pod may have
    planted some)."""
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode):
        msg = f"{root} is not a directory"
        raise RuntimeFailure(msg)
    with beneath.Dir.open(root) as folder:
        chown_folder(folder, base, owner=owner)


def chown_folder(folder: beneath.Dir, base: int, *, owner: int = 0) -> None:
    """:func:`chown_tree` of an open folder (the one a caller checked, whatever its name is now)."""
    st = os.fstat(folder.fd)
    top = base + owner
    if st.st_uid == top and st.st_gid == top:
        return
    os.fchown(folder.fd, top, top)
    if valid_owner(st.st_uid, base):
        return  # the pod's own already (another of its users): only the top changes

    def shifted(entry: os.stat_result) -> tuple[int, int]:
        # Shift ids into the range (0 -> base, 1000 -> base+1000); foreign ids -> base.
        uid = entry.st_uid if valid_owner(entry.st_uid, base) else base + entry.st_uid % IDS_PER_POD
        gid = entry.st_gid if valid_owner(entry.st_gid, base) else base + entry.st_gid % IDS_PER_POD
        return uid, gid

    # A descriptor walk beneath the folder: a running pod sharing the volume may swap a
    # folder for a symlink meanwhile; the walk never leaves the volume.
    with contextlib.suppress(OSError):
        beneath.chown_tree(folder, shifted)


def valid_owner(uid: int, base: int) -> bool:
    return base <= uid < base + IDS_PER_POD
