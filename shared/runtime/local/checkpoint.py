"""Memory-keeping checkpoints of a local pod: CRIU dumps the pod's whole process tree (its PID 1,
the daemon, every process started in it) with its memory into host-owned images, and restores
it into the pod's own namespaces, user namespace included.

How a tree in a user namespace restores (CRIU 4.2, ``scripts/build-criu.sh``; each point is an
error seen otherwise, see ``docs/memory-pause.md``):

- **Dump from inside the pod's network namespace.** The pod's netns belongs to the host's user
  namespace (sandbox root must not administer its own network), and CRIU refuses a tree whose
  namespaces do not all belong to the tree's user namespace ("One or more namespaces doesn't
  belong to the target user namespace"). Run in that netns, CRIU treats it as its own: not
  dumped, inherited on restore. The user, mount, PID, IPC and UTS namespaces are dumped.
- **Dump as the owner of the pod's user namespace.** Reading a task's rlimits of another uid
  needs CAP_SYS_RESOURCE over its user namespace, which a host without that capability in its
  bounding set lacks ("Can't get rlimit 0: Operation not permitted"); the namespace's owner has
  every capability in it. CRIU then runs as that uid with the runtime's capabilities kept
  (``--unprivileged``: CRIU's name for "not uid 0"). A pod CRIU restored belongs to root: root.
- **Every bind from the host is an external mount with a key**, and on restore it is bound from
  a stage (a tmpfs in a private mount namespace holding a bind of each source): the restored
  user namespace's root is an unprivileged host uid that may not traverse the host folders above
  a source ("Can't bind-mount ...: Permission denied").
- **Files opened from outside the pod's mount namespace are external files** (bubblewrap's own
  binary and libraries mapped by the pod's PID 1, "Can't lookup mount=N for fd=-3"), handed back
  on restore as descriptors (``--inherit-fd``) after checking they are the same inodes; the pipe
  of the pod's output is handed back as the new log pipe.
- **Nested user namespaces stay forbidden**: ``user.max_user_namespaces`` of the restored
  namespace is written 0 by an action script before any task runs (CRIU does not restore it).

The images are the host's: root-owned files in a 0700 folder the caller chooses (the pod's
sandbox never sees it). Only the CRIU binary's own checks (``criu check``) decide availability.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import stat
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog

from shared.errors import RuntimeFailure
from shared.runtime.local.mounts import private_shell

log = structlog.get_logger()

ENV_CRIU = "TORPOR_CRIU"  # the criu command (default: scripts/build-criu.sh's wrapper)
META = "torpor-checkpoint.json"
# Each restore mounts its own tmpfs here, in its own mount namespace: the restored user
# namespace's root must traverse it, so it lives under the world-traversable /run.
STAGE_DIR = Path("/run/torpor-criu-stage")
_NS_GET_OWNER_UID = 0xB704
_OUTPUT_TAIL = 400
# Capability numbers (linux/capability.h) to the names setpriv takes.
_CAPS = (
    "chown",
    "dac_override",
    "dac_read_search",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "linux_immutable",
    "net_bind_service",
    "net_broadcast",
    "net_admin",
    "net_raw",
    "ipc_lock",
    "ipc_owner",
    "sys_module",
    "sys_rawio",
    "sys_chroot",
    "sys_ptrace",
    "sys_pacct",
    "sys_admin",
    "sys_boot",
    "sys_nice",
    "sys_resource",
    "sys_time",
    "sys_tty_config",
    "mknod",
    "lease",
    "audit_write",
    "audit_control",
    "setfcap",
    "mac_override",
    "mac_admin",
    "syslog",
    "wake_alarm",
    "block_suspend",
    "audit_read",
    "perfmon",
    "bpf",
    "checkpoint_restore",
)
# CRIU's action script (a file it executes, with the restored tree's PID 1 in CRTOOLS_INIT_PID),
# run once the namespaces exist and before any restored task does.
_NEST_SCRIPT = "forbid-nested-userns.sh"
_NEST_FORBIDDEN = """#!/bin/sh
[ "$CRTOOLS_SCRIPT_ACTION" = setup-namespaces ] || exit 0
exec nsenter --user=/proc/"$CRTOOLS_INIT_PID"/ns/user -- \\
  /bin/sh -c 'echo 0 > /proc/sys/user/max_user_namespaces'
"""
# Run as root in a private mount namespace: a tmpfs stage, each source bound onto <stage>/<n>.
# Each source comes with the ``dev:ino`` its bound file or folder must have, or ``-`` (as
# ``bwrap._STAGE_SCRIPT``): mount resolves the path again, so what it bound is checked after it
# (a mount cannot be swapped, a name can: a volume folder's parent is the sandbox owner's).
_STAGE_SCRIPT = """set -e
stage=$1; shift
mount -t tmpfs -o mode=0755,size=64k,nosuid,nodev torpor-criu-stage "$stage"
i=0
while [ "$1" != "--" ]; do
  if [ -d "$1" ]; then mkdir "$stage/$i"; else : > "$stage/$i"; fi
  mount --bind "$1" "$stage/$i"
  if [ "$2" != - ] && [ "$(stat -c %d:%i "$stage/$i")" != "$2" ]; then
    echo "torpor-criu-stage: refused: $1 is not the one this pod start checked" \\
      "(a name on its way was swapped, e.g. for a symlink)" >&2
    exit 1
  fi
  i=$((i + 1)); shift 2
done
shift
exec "$@"
"""
# The restored tree's PID 1 (bubblewrap, dumpable) is made non-dumpable in its image: a restored
# task is in no Landlock domain (CRIU restores none), so only "not dumpable" (ptrace, pidfd_getfd
# and /proc/<pid>/mem need CAP_SYS_PTRACE over its mm's user namespace, which sandbox root does
# not have) keeps sandbox code off it, as it keeps it off the daemon (which makes itself so).
_IMG_COMMON_MAGIC = 0x54564319
_MM_DUMPABLE = 15  # mm_entry.dumpable (images/mm.proto)
_PSTREE_PID = 1  # pstree_entry.pid


class CheckpointFailure(RuntimeFailure):
    """A dump or restore that did not happen; the pod falls back to a files-only pause."""


@dataclass(frozen=True)
class Capability:
    available: bool
    version: str  # "Version: 4.2.1", or "" when criu did not run
    reason: str  # why not, when not available


@dataclass(frozen=True)
class PodTree:
    """A running pod as a checkpoint sees it."""

    pid: int  # host pid of the pod's PID 1 (the inner bwrap)
    enter: Sequence[str]  # argv prefix that enters the pod's network namespace


@dataclass(frozen=True)
class RestoreTarget:
    """Where a tree comes back: the pod's root (mounted as at a pod start), its network
    namespace, and the write end of its new output pipe.

    ``identities``: the ``dev:ino`` each bind source under ``checked_dir`` must have (the
    runtime opened them safely for this pod start); a source of the images under ``checked_dir``
    without one is refused, the others (the OS, torpor's code) are bound by path as at a start.
    """

    root: Path
    enter: Sequence[str]
    output_fd: int
    identities: Mapping[str, str] = field(default_factory=dict)
    checked_dir: Path | None = None


class Checkpointer(Protocol):
    async def dump(
        self, pod: PodTree, images: Path, *, identity: Mapping[str, str] | None = None
    ) -> None: ...

    async def restore(
        self, target: RestoreTarget, images: Path, *, identity: Mapping[str, str] | None = None
    ) -> int: ...


def default_criu() -> str | None:
    """``$TORPOR_CRIU``, else the wrapper ``scripts/build-criu.sh`` installs, else ``criu``."""
    if os.environ.get(ENV_CRIU):
        return os.environ[ENV_CRIU]
    cache = os.environ.get("TORPOR_CRIU_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "torpor", "criu"
    )
    wrapper = Path(cache) / "current" / "bin" / "criu"
    if wrapper.exists():
        return str(wrapper)
    return shutil.which("criu")


async def probe(criu: str | None) -> Capability:
    """``criu --version`` (4.2 or newer) and ``criu check`` on this kernel."""
    if criu is None:
        return Capability(False, "", "CRIU is not installed (scripts/build-criu.sh)")
    rc, out = await _run([criu, "--version"])
    version = next((line for line in out.splitlines() if line.startswith("Version:")), "")
    if rc != 0 or not version:
        return Capability(False, "", f"{criu} --version failed: {out[-_OUTPUT_TAIL:]}")
    try:
        major, minor = (int(x) for x in version.split()[1].split(".")[:2])
    except (IndexError, ValueError):
        return Capability(False, version, f"unreadable CRIU version {version!r}")
    if (major, minor) < (4, 2):
        return Capability(False, version, f"CRIU {major}.{minor} is too old (4.2 needed)")
    rc, out = await _run([criu, "check"])
    if rc != 0:
        return Capability(False, version, f"criu check failed: {out.strip()[-_OUTPUT_TAIL:]}")
    return Capability(True, version, "")


class Criu:
    """:class:`Checkpointer` by the CRIU binary ``criu``."""

    def __init__(self, criu: str) -> None:
        self._criu = criu

    async def dump(
        self, pod: PodTree, images: Path, *, identity: Mapping[str, str] | None = None
    ) -> None:
        """Dump pod ``pod`` into the new folder ``images`` (host root's, 0700); the pod's
        processes are gone afterwards. ``identity`` (whose pod this is: sandbox, pod uid) is
        kept with the images, and a restore must name it. Raises :class:`CheckpointFailure`
        (the pod then still runs, unless CRIU failed after it killed it)."""
        tree = await asyncio.to_thread(inspect_tree, pod.pid)
        await asyncio.to_thread(_new_private_dir, images)
        owner = await asyncio.to_thread(userns_owner, pod.pid)
        argv = [*pod.enter]
        if owner != 0:
            caps = await asyncio.to_thread(_effective_caps)
            argv += [
                "setpriv",
                f"--reuid={owner}",
                f"--regid={owner}",
                "--clear-groups",
                f"--inh-caps={caps}",
                f"--ambient-caps={caps}",
                "--",
            ]
        argv += [self._criu, "dump", "-t", str(pod.pid), "-D", str(images), "-o", "dump.log"]
        if owner != 0:
            argv.append("--unprivileged")
        # --file-locks: a process holding a flock or POSIX lock (a Jupyter kernel's history
        # database, pip, apt) is otherwise refused ("Some file locks are hold by dumping tasks").
        argv += ["--tcp-established", "--file-locks"]
        for mount in tree.mounts:
            argv += ["--external", f"mnt[{mount.mountpoint}]:{mount.key}"]
        for file in tree.files:
            argv += ["--external", file.key]
        rc, out = await _run(argv)
        await asyncio.to_thread(_own_images, images)
        if rc != 0:
            raise CheckpointFailure(f"criu dump failed: {_errors(images / 'dump.log', out)}")
        await _wait_dead(pod.pid)  # CRIU killed the tree; its PID 1's parent reaps it
        refuse_ghosts(images)
        await asyncio.to_thread(seal_init, images)
        meta = {
            "identity": dict(identity or {}),
            "gid": tree.gid,
            "mounts": [m.__dict__ for m in tree.mounts],
            "files": [f.__dict__ for f in tree.files],
            "pipes": tree.pipes,
        }
        await asyncio.to_thread(_write_private, images / META, json.dumps(meta))

    async def restore(
        self, target: RestoreTarget, images: Path, *, identity: Mapping[str, str] | None = None
    ) -> int:
        """Restore the tree of ``images`` into ``target``; returns the host pid of its PID 1.
        Refuses images without the dump's record (a partial or foreign folder), images whose
        record names another ``identity`` (another sandbox's or pod's), and a bind source under
        ``target.checked_dir`` that this start did not check."""
        meta = await asyncio.to_thread(_read_meta, images)
        if identity is not None and meta.get("identity") != dict(identity):
            msg = f"checkpoint images {images} are not this pod's (they name another sandbox)"
            raise CheckpointFailure(msg)
        if await asyncio.to_thread(pid1_dumpable, images) != 0:
            msg = f"checkpoint images {images} would restore a dumpable PID 1 (not sealed)"
            raise CheckpointFailure(msg)
        refuse_ghosts(images)
        mounts = [ExternalMount(**m) for m in meta["mounts"]]
        checks = [_expected_identity(m.source, target) for m in mounts]
        files = [ExternalFile(**f) for f in meta["files"]]
        fds: list[int] = []
        try:
            inherit: list[str] = []
            for file in files:
                fd = await asyncio.to_thread(_open_same, file)
                fds.append(fd)
                inherit += ["--inherit-fd", f"fd[{fd}]:{file.key}"]
            for pipe in meta["pipes"]:
                inherit += ["--inherit-fd", f"fd[{target.output_fd}]:{pipe}"]
            stage = STAGE_DIR
            await asyncio.to_thread(stage.mkdir, mode=0o755, exist_ok=True)
            pidfile = images / "restored.pid"
            with contextlib.suppress(FileNotFoundError):
                pidfile.unlink()  # criu refuses an existing one
            argv = [*target.enter, *private_shell(_STAGE_SCRIPT, "torpor-criu-stage")]
            argv += [str(stage)]
            for mount, check in zip(mounts, checks, strict=True):
                argv += [mount.source, check]
            argv += ["--", self._criu, "restore", "-D", str(images), "-o", "restore.log", "-d"]
            argv += ["--root", str(target.root), "--tcp-close", "--file-locks"]
            argv += ["--pidfile", str(pidfile)]
            script = images / _NEST_SCRIPT
            await asyncio.to_thread(_write_script, script)
            argv += ["--action-script", str(script)]
            for i, mount in enumerate(mounts):
                argv += ["--external", f"mnt[{mount.key}]:{stage / str(i)}"]
            argv += inherit
            # The restoring tasks are the pod's ids already and read the images as such: its
            # group may read them for as long as the restore takes, no one else ever.
            await asyncio.to_thread(_share_images, images, int(meta.get("gid", 0)))
            try:
                rc, out = await _run(argv, pass_fds=[*fds, target.output_fd])
            finally:
                await asyncio.to_thread(_own_images, images)
        finally:
            for fd in fds:
                os.close(fd)
        if rc != 0:
            raise CheckpointFailure(f"criu restore failed: {_errors(images / 'restore.log', out)}")
        try:
            return int(pidfile.read_text().strip())
        except (OSError, ValueError) as e:
            raise CheckpointFailure(f"criu restore left no pid file ({e})") from e


# ---- what the tree holds from outside its mount namespace ------------------------------


@dataclass(frozen=True)
class ExternalMount:
    key: str
    mountpoint: str  # inside the pod
    source: str  # on the host


@dataclass(frozen=True)
class ExternalFile:
    key: str  # CRIU's file[<mnt id>:<inode>], both hex
    path: str  # on the host
    dev: int
    ino: int


@dataclass(frozen=True)
class Tree:
    mounts: list[ExternalMount]
    files: list[ExternalFile]
    pipes: list[str]  # pipe:[ino] of the pod's output (its reader is on the host)
    gid: int  # host gid of the pod's root: the restoring tasks read the images as it


@dataclass(frozen=True)
class _MountLine:
    mnt_id: int
    dev: str
    root: str
    mountpoint: str


def _mountinfo(path: str) -> list[_MountLine]:
    lines = []
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split(" ")
            lines.append(
                _MountLine(int(fields[0]), fields[2], _unescape(fields[3]), _unescape(fields[4]))
            )
    return lines


def _unescape(field: str) -> str:
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _host_source(mount: _MountLine, host: Sequence[_MountLine]) -> str | None:
    """Where on the host the pod's mount ``mount`` comes from: a host mount of the same
    filesystem whose root holds the pod mount's root. ``None``: the pod's own (proc, tmpfs)."""
    best: _MountLine | None = None
    for h in host:
        if h.dev != mount.dev:
            continue
        inside = mount.root == h.root or mount.root.startswith(h.root.rstrip("/") + "/")
        if inside and (best is None or len(h.root) > len(best.root)):
            best = h
    if best is None:
        return None
    rest = mount.root[len(best.root.rstrip("/")) :] if best.root != "/" else mount.root
    return os.path.normpath(best.mountpoint.rstrip("/") + "/" + rest.lstrip("/"))


def _expected_identity(source: str, target: RestoreTarget) -> str:
    """The ``dev:ino`` the stage must find bound for ``source``, or ``-`` (bound by path)."""
    if target.checked_dir is None or not _within(source, target.checked_dir):
        return "-"
    found = target.identities.get(source)
    if found is None:
        msg = f"the checkpoint binds {source!r}, which this pod start did not check"
        raise CheckpointFailure(msg)
    return found


def _within(path: str, folder: Path) -> bool:
    try:
        Path(os.path.normpath(path)).relative_to(folder)
    except ValueError:
        return False
    return True


def tree_pids(pid: int) -> list[int]:
    found = [pid]
    i = 0
    while i < len(found):
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{found[i]}/task"):
                with open(f"/proc/{found[i]}/task/{task}/children") as f:
                    found += [int(c) for c in f.read().split()]
        i += 1
    return found


def inspect_tree(pid: int) -> Tree:
    """The external mounts, files and pipes of the tree of ``pid`` (see the module docstring)."""
    pod = _mountinfo(f"/proc/{pid}/mountinfo")
    host = _mountinfo("/proc/self/mountinfo")
    mounts = []
    for i, m in enumerate(pod):
        if m.mountpoint == "/":
            continue
        source = _host_source(m, host)
        if source is not None:
            mounts.append(ExternalMount(key=f"m{i}", mountpoint=m.mountpoint, source=source))
    own = {m.mnt_id for m in pod}
    files: dict[str, ExternalFile] = {}
    for p in tree_pids(pid):
        for entry in _opened(p):
            try:
                link = os.readlink(entry)
            except OSError:
                continue
            if link.startswith("/"):  # not sockets, pipes, anon inodes: CRIU's own business
                _note_file(entry, link, own, files)
    # The pod's output: the pipe PID 1 writes to (bwrap hands it to the daemon); its reader is
    # on the host, so the restore gets a new one. Every other pipe is CRIU's to restore.
    outputs: list[str] = []
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("pipe:[") and link not in outputs:
                outputs.append(link)
    with open(f"/proc/{pid}/gid_map") as f:
        gid = next((int(x.split()[1]) for x in f if x.split()[:1] == ["0"]), 0)
    return Tree(mounts=mounts, files=list(files.values()), pipes=outputs, gid=gid)


def _opened(pid: int) -> list[str]:
    """The /proc entries of every open file and file mapping of ``pid``."""
    out: list[str] = []
    for folder in ("fd", "map_files"):
        with contextlib.suppress(OSError):
            out += [
                f"/proc/{pid}/{folder}/{entry}" for entry in os.listdir(f"/proc/{pid}/{folder}")
            ]
    return out


def _note_file(entry: str, link: str, own: set[int], files: dict[str, ExternalFile]) -> None:
    try:
        fd = os.open(entry, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        with open(f"/proc/self/fdinfo/{fd}") as f:
            mnt_id = next(int(x.split()[1]) for x in f if x.startswith("mnt_id:"))
    except (OSError, StopIteration):
        return
    finally:
        os.close(fd)
    if mnt_id in own or not stat.S_ISREG(st.st_mode):
        return
    key = f"file[{mnt_id:x}:{st.st_ino:x}]"
    path = link.removesuffix(" (deleted)")
    files.setdefault(key, ExternalFile(key=key, path=path, dev=st.st_dev, ino=st.st_ino))


def _open_same(file: ExternalFile) -> int:
    """A descriptor of the host file the tree had open: the same inode, or a refusal. A copy of
    bwrap staged for the pod is gone; the host's bwrap is the same program."""
    candidates = [file.path]
    if os.path.basename(file.path) == "bwrap" or "torpor-stage" in file.path:
        found = shutil.which("bwrap")
        if found:
            candidates.append(os.path.realpath(found))
    for path in candidates:
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == (file.dev, file.ino) or path != file.path:
                os.set_inheritable(fd, True)
                return fd
            os.close(fd)
    msg = f"a file the pod had open is gone or changed: {file.path}"
    raise CheckpointFailure(msg)


# ---- PID 1 restored non-dumpable ------------------------------------------------------


def seal_init(images: Path) -> None:
    """Rewrite the image of the tree's PID 1 (the first ``pstree`` entry) so that its restored
    mm is not dumpable (see ``_MM_DUMPABLE``); every other task keeps what it had."""
    root = _first_entry(images / "pstree.img")
    pid = _varint_field(root, _PSTREE_PID)
    if pid is None:
        msg = "checkpoint images have no pstree root"
        raise CheckpointFailure(msg)
    path = images / f"mm-{pid}.img"
    head, entry, tail = _split_image(path.read_bytes(), path)
    fields = [f for f in _fields(entry) if f[0] != _MM_DUMPABLE]
    body = b"".join(raw for _, _, raw in fields) + _varint(_MM_DUMPABLE << 3) + _varint(0)
    partial = path.with_name(path.name + ".partial")
    _write_private(partial, "")
    partial.write_bytes(head + struct.pack("<I", len(body)) + body + tail)
    os.replace(partial, path)
    if _varint_field(_split_image(path.read_bytes(), path)[1], _MM_DUMPABLE) != 0:
        msg = f"{path.name}: PID 1 could not be made non-dumpable"
        raise CheckpointFailure(msg)


def pid1_dumpable(images: Path) -> int | None:
    """The dumpable flag PID 1's image restores (tests, and the restore's own check)."""
    pid = _varint_field(_first_entry(images / "pstree.img"), _PSTREE_PID)
    path = images / f"mm-{pid}.img"
    return _varint_field(_split_image(path.read_bytes(), path)[1], _MM_DUMPABLE)


def _split_image(data: bytes, path: Path) -> tuple[bytes, bytes, bytes]:
    """(magic header, first entry, the rest) of a CRIU image: magics, then entries each after
    its 32-bit size."""
    try:
        head = 8 if struct.unpack_from("<I", data)[0] == _IMG_COMMON_MAGIC else 4
        (size,) = struct.unpack_from("<I", data, head)
    except struct.error as e:
        raise CheckpointFailure(f"{path.name} is not a CRIU image ({e})") from e
    start = head + 4
    if start + size > len(data):
        msg = f"{path.name} is truncated"
        raise CheckpointFailure(msg)
    return data[:head], data[start : start + size], data[start + size :]


def _first_entry(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointFailure(f"checkpoint images lack {path.name} ({e.strerror})") from e
    return _split_image(data, path)[1]


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data) or shift > 63:
            msg = "malformed protobuf varint in a CRIU image"
            raise CheckpointFailure(msg)
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _fields(message: bytes) -> list[tuple[int, int | None, bytes]]:
    """Top-level (field number, varint value or None, raw bytes) of a protobuf message."""
    out: list[tuple[int, int | None, bytes]] = []
    i = 0
    while i < len(message):
        start = i
        tag, i = _read_varint(message, i)
        number, wire = tag >> 3, tag & 7
        value: int | None = None
        if wire == 0:
            value, i = _read_varint(message, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            length, i = _read_varint(message, i)
            i += length
        else:
            msg = f"unexpected protobuf wire type {wire} in a CRIU image"
            raise CheckpointFailure(msg)
        if i > len(message):
            msg = "truncated protobuf field in a CRIU image"
            raise CheckpointFailure(msg)
        out.append((number, value, message[start:i]))
    return out


def _varint_field(message: bytes, number: int) -> int | None:
    """The last value of varint field ``number`` (protobuf: the last one wins)."""
    found = None
    for n, value, _ in _fields(message):
        if n == number and value is not None:
            found = value
    return found


# ---- helpers ---------------------------------------------------------------------------


def is_dead(pid: int) -> bool:
    """Gone, or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return True
    return text[text.rfind(")") + 2 :].startswith("Z")


async def _wait_dead(pid: int, within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not is_dead(pid):
        if asyncio.get_running_loop().time() > deadline:
            msg = f"the pod's PID 1 ({pid}) outlived its dump"
            raise CheckpointFailure(msg)
        await asyncio.sleep(0.01)


def userns_owner(pid: int) -> int:
    """The host uid owning the user namespace of ``pid`` (``NS_GET_OWNER_UID``)."""
    fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    try:
        buf = bytearray(4)
        fcntl.ioctl(fd, _NS_GET_OWNER_UID, buf)
        return int(struct.unpack("I", buf)[0])
    finally:
        os.close(fd)


def _effective_caps() -> str:
    """This process's effective capabilities as setpriv's list (``+chown,+kill,...``)."""
    with open("/proc/self/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    return ",".join(f"+{name}" for bit, name in enumerate(_CAPS) if mask >> bit & 1)


def _new_private_dir(path: Path) -> None:
    if path.exists():
        msg = f"checkpoint images {path} exist already"
        raise CheckpointFailure(msg)
    path.mkdir(mode=0o700)
    os.chown(path, 0, 0)


GHOSTS = "ghost-file-*.img"


def refuse_ghosts(images: Path) -> None:
    """A deleted file a process keeps open is a "ghost" that CRIU's restore, as host root,
    creates again *by its dumped path* before the tasks run; the sandbox may have swapped a
    folder on that path for a symlink after the unlink (a restore then followed it out of the
    pod: ``Can't create ghost regfile`` through the link, tests/security/
    test_memory_pause_hostile.py). No memory is kept for such a tree: files only, with this
    reason."""
    ghosts = sum(1 for _ in images.glob(GHOSTS))
    if ghosts:
        msg = (
            f"a process keeps {ghosts} deleted file(s) open, which CRIU would create again by "
            "path, as host root, on restore"
        )
        raise CheckpointFailure(msg)


def _own_images(images: Path) -> None:
    """Root's only: CRIU run as the pod's owner wrote its files as that uid."""
    _set_images(images, gid=0, folder_mode=0o700, file_mode=0o600)


def _share_images(images: Path, gid: int) -> None:
    _set_images(images, gid=gid, folder_mode=0o750, file_mode=0o640)


def _set_images(images: Path, *, gid: int, folder_mode: int, file_mode: int) -> None:
    for entry in os.scandir(images):
        if entry.name == _NEST_SCRIPT:  # root runs it
            os.chmod(entry.path, 0o700)
        elif entry.is_file(follow_symlinks=False):
            os.chown(entry.path, 0, gid, follow_symlinks=False)
            os.chmod(entry.path, file_mode)
    os.chown(images, 0, gid)
    os.chmod(images, folder_mode)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _write_script(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o700)
    with os.fdopen(fd, "w") as f:
        f.write(_NEST_FORBIDDEN)


def _read_meta(images: Path) -> dict[str, Any]:
    st = os.lstat(images)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o077:
        msg = f"checkpoint images {images} are not a private folder of root's"
        raise CheckpointFailure(msg)
    try:
        meta = json.loads((images / META).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointFailure(f"checkpoint images {images} are incomplete ({e})") from e
    if not isinstance(meta, dict) or {"mounts", "files", "pipes"} - meta.keys():
        msg = f"checkpoint images {images} are incomplete"
        raise CheckpointFailure(msg)
    return meta


def _errors(log_path: Path, output: str) -> str:
    """CRIU's error lines (its log says more than its exit code), bounded."""
    lines: list[str] = []
    with contextlib.suppress(OSError):
        lines = [
            line.strip()
            for line in log_path.read_text(errors="replace").splitlines()
            if "Error" in line and "RLIMIT_NOFILE for self" not in line
        ]
    text = "; ".join(lines[:4]) or output.strip()
    return text[-_OUTPUT_TAIL * 2 :] or "no output"


async def _run(argv: Sequence[str], *, pass_fds: Sequence[int] = ()) -> tuple[int, str]:
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            pass_fds=tuple(pass_fds),
            env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
        )
    except OSError as e:
        return 127, f"{argv[0]}: {e.strerror}"
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode(errors="replace")
