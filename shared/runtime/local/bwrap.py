"""The pod's bubblewrap command line, and the check that bubblewrap works on this host.

A pod is an outer ``bwrap`` process (in its own session, so it outlives the runtime that started
it) whose child, the inner ``bwrap``, is PID 1 of fresh user, PID, IPC, UTS and mount namespaces
running the in-sandbox daemon. There is deliberately no ``--die-with-parent`` (it would kill pods
with their owner, while a restarted owner must find them running). bwrap runs as the workload's
unprivileged host uid (see :mod:`.userns`); what it binds is staged for it by
:func:`stage_prefix`. The ``TORPOR_*`` marks on the command line name a pod, but only its place
in the PID namespace tree makes it one of ours (see :mod:`.procfs`).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from shared.errors import ConfigError, RuntimeFailure
from shared.runtime.local import etc, mounts

ENV_POD_UID = "TORPOR_POD_UID"
ENV_WORKLOAD = "TORPOR_WORKLOAD"
ENV_RUNTIME = "TORPOR_RUNTIME_ID"  # runtime_id() of the data dir
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")
INSTALL_HINT = "install it with `apt-get install -y bubblewrap`"
# Host directories every pod sees read-only: the OS, plus the interpreter and code of the daemon.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")


async def check_bwrap(bwrap: str) -> None:
    """Fail with one clear line when bubblewrap is missing or cannot create a PID namespace."""
    setpriv_path()  # pods start through it (see .userns)
    try:
        proc = await asyncio.create_subprocess_exec(
            bwrap,
            "--unshare-pid",
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--",
            "true",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as e:
        msg = f"bubblewrap ({bwrap}) is not available ({e.strerror}): {INSTALL_HINT}"
        raise ConfigError(msg) from e
    _, err = await proc.communicate()
    if proc.returncode != 0:
        reason = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        msg = (
            f"bubblewrap ({bwrap}) cannot create namespaces here ({reason[0]}): {INSTALL_HINT} "
            "and allow user namespaces (sysctl kernel.unprivileged_userns_clone=1)"
        )
        raise ConfigError(msg)


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool = False
    # "dev:ino" of the folder the host opened beneath its root (see .launcher): the stage binds
    # by path and refuses the pod unless what it bound is that folder (a tenant may have swapped
    # a name on the way for a symlink since). None: a path only the operator chose.
    identity: str | None = None


@dataclass(frozen=True)
class PodLaunch:
    """Everything needed to build one pod's command line."""

    bwrap: str
    uid: str
    workload: str
    runtime_root: Path  # the runtime's data dir: marks the pod as ours, masked inside the pod
    workspace: Path  # bound as /workspace when there is no ``root``
    workdir: str
    mounts: Sequence[Mount]
    env: dict[str, str]
    command: Sequence[str]
    code_dirs: Sequence[Path]  # interpreter + venv + repo, bound read-only
    hostname: str
    pycache: Path | None = None  # the daemon's bytecode cache, bound read-only (see .bytecode)
    # The workload's host id range (see .userns); None: no user namespace (test rigs only).
    id_base: int | None = None
    etc_dir: Path | None = None  # the pod's generated /etc (see .etc); None: the host's /etc
    tmp_size: int | None = None  # bytes for the pod's /tmp and /run tmpfs
    # The pod's own root filesystem (the rootfs under its writable layer, see .launcher), bound
    # as ``/``; None (test rigs only): a tmpfs root with the host's read-only system folders.
    root: Path | None = None
    # Capabilities sandbox root keeps inside its own user namespace (see CAPABILITIES).
    capabilities: Sequence[str] = ()
    # Read-only binds of (host source, path inside) after the code dirs: the daemon's package
    # and bytecode under names of no host path (see .pod_commands.DAEMON_DIR).
    daemon_binds: Sequence[tuple[Path, str]] = ()


# What sandbox root keeps, in its own user namespace only (Docker's default set, less what a pod
# has no use for): switch users (the daemon runs commands as `user`), own and read their files
# (dpkg, pip as root), signal their processes. Over the host, whose user namespace holds every
# other object (its files, processes, the pod's network namespace), these give nothing.
CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
)


@dataclass(frozen=True)
class UsernsFds:
    """bwrap waits on ``block`` until the runtime has mapped ids; it writes its child's pid to
    ``info`` (``--userns-block-fd``, ``--info-fd``)."""

    block: int
    info: int


def bwrap_argv(
    launch: PodLaunch,
    *,
    userns: UsernsFds | None = None,
    staged: Mapping[Path, str] | None = None,
) -> list[str]:
    """The pod's whole bwrap command line, every option in argv (test rigs; pods start with
    :func:`hidden_argv`). With ``launch.id_base`` the pod gets a user namespace whose ids the
    runtime maps (see :mod:`.userns`): pass ``userns``, and in ``staged`` where
    :func:`stage_prefix` makes each host path bound into the pod visible to bwrap, which then
    runs as an unprivileged host uid that may not traverse the folders above them.

    Hostile values cannot become options: every value follows its option as its own argv
    element, and the environment is checked by :func:`check_env`."""
    prefix, options = _options(launch, userns, staged)
    return [*prefix, launch.bwrap, *options, *_marks(launch), "--", *launch.command]


def hidden_argv(
    launch: PodLaunch,
    args_fd: int,
    *,
    userns: UsernsFds | None = None,
    staged: Mapping[Path, str] | None = None,
) -> tuple[list[str], bytes]:
    """The pod's command line and what bwrap reads from ``args_fd`` (``--args``): every option
    and the environment go through the descriptor, so the command line the sandbox can read
    (``/proc/1/cmdline``: the inner bwrap is its PID 1) names no host path, and ``ps`` on the host
    shows no access token. Only the marks that identify the pod stay in argv, before the options,
    whose ``--clearenv`` keeps them out of the sandbox's environment."""
    prefix, options = _options(launch, userns, staged)
    argv = [*prefix, launch.bwrap, *_marks(launch), "--args", str(args_fd), "--", *launch.command]
    return argv, b"".join(o.encode() + b"\0" for o in options)


def runtime_id(runtime_root: Path) -> str:
    """What marks a pod as started with this data dir: a digest, not the host path itself."""
    return hashlib.sha256(str(runtime_root).encode()).hexdigest()[:20]


def _marks(launch: PodLaunch) -> list[str]:
    marks = {
        ENV_POD_UID: launch.uid,
        ENV_WORKLOAD: launch.workload,
        ENV_RUNTIME: runtime_id(launch.runtime_root),
    }
    return [part for key, value in marks.items() for part in ("--setenv", key, value)]


def _options(
    launch: PodLaunch, userns: UsernsFds | None, staged: Mapping[Path, str] | None
) -> tuple[list[str], list[str]]:
    """(the prefix that runs bwrap as the range's uid, bwrap's options and environment)."""
    check_env(launch.env)
    staged = staged or {}

    def bind(source: Path, dest: str, *, read_only: bool) -> list[str]:
        return ["--ro-bind" if read_only else "--bind", staged.get(source, str(source)), dest]

    prefix: list[str] = []
    argv: list[str] = []
    if launch.id_base is not None:
        if userns is None:
            msg = "a pod with a user namespace needs the userns descriptors"
            raise ValueError(msg)
        base = str(launch.id_base)
        # bwrap creates the namespace as the range's host uid (root outside would be unmapped).
        prefix = [setpriv_path(), f"--reuid={base}", f"--regid={base}", "--clear-groups", "--"]
        argv += [
            "--unshare-user",
            "--userns-block-fd",
            str(userns.block),
            "--info-fd",
            str(userns.info),
            "--uid",
            "0",
            "--gid",
            "0",
        ]
    argv += [
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--hostname",
        launch.hostname,
        "--new-session",
        "--clearenv",
        # bwrap run by root keeps every capability; sandbox code gets only these, and only
        # over its own namespaces.
        "--cap-drop",
        "ALL",
    ]
    for capability in launch.capabilities:
        argv += ["--cap-add", capability]
    size = [] if launch.tmp_size is None else ["--size", str(launch.tmp_size)]
    system_dirs: list[str] = []
    if launch.root is not None:
        # The pod's own root (rootfs + its writable layer): /tmp and /workspace are in it, kept
        # with the layer; its /etc is the rootfs's, with the generated identity files on top.
        argv += bind(launch.root, "/", read_only=False)
        if launch.etc_dir is not None:
            argv += etc.bwrap_args(launch.etc_dir, bind)
        argv += ["--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", "/run"]
    else:
        # A fresh root: only what is listed below exists, so pods cannot read each other's
        # workspaces or torpor's data dir through the host filesystem.
        argv += ["--tmpfs", "/"]
        system_dirs = [d for d in SYSTEM_DIRS if launch.etc_dir is None or d != "/etc"]
        for folder in system_dirs:
            if os.path.islink(folder):
                argv += ["--symlink", os.readlink(folder), folder]
            elif os.path.isdir(folder):
                argv += ["--ro-bind", folder, folder]
        if launch.etc_dir is not None:
            argv += etc.host_bwrap_args(launch.etc_dir, bind)
        argv += [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            *size,
            "--tmpfs",
            "/tmp",  # noqa: S108 - the pod's own /tmp, a fresh tmpfs
            *size,
            "--tmpfs",
            "/run",
        ]
    # Kernel knobs stay read-only (as Docker does) even for a root that a bug gave capabilities.
    for knob in PROC_READ_ONLY:
        if os.path.exists(knob):
            argv += ["--ro-bind", knob, knob]
    # After the /tmp and /run tmpfs: a checkout or venv that lives under /tmp must stay visible.
    for code_dir in launch.code_dirs:
        argv += bind(code_dir, str(code_dir), read_only=True)
    for folder in [*system_dirs, *map(str, launch.code_dirs)]:
        # Hide the data dir if one of the read-only binds contains it.
        if is_within(launch.runtime_root, Path(folder)):
            argv += ["--tmpfs", str(launch.runtime_root)]
            break
    if launch.pycache is not None:  # after the data dir's mask: the cache may live in it
        argv += bind(launch.pycache, str(launch.pycache), read_only=True)
    for source, inside in launch.daemon_binds:
        argv += bind(source, inside, read_only=True)
    if launch.root is None:
        argv += bind(launch.workspace, "/workspace", read_only=False)
    for mount in launch.mounts:
        argv += bind(mount.source, mount.target, read_only=mount.read_only)
    argv += ["--chdir", launch.workdir]
    for key, value in launch.env.items():
        argv += ["--setenv", key, value]
    return prefix, argv


def bind_identities(launch: PodLaunch) -> dict[Path, str]:
    """The bind sources whose bound folder must be a known one (see ``Mount.identity``)."""
    return {m.source: m.identity for m in launch.mounts if m.identity is not None}


def identity(st: os.stat_result) -> str:
    """A folder's ``dev:ino``, as the stage compares it (``stat -c %d:%i``)."""
    return f"{st.st_dev}:{st.st_ino}"


def bind_sources(launch: PodLaunch) -> list[Path]:
    """The host paths :func:`bwrap_argv` binds by descriptor when it is given them."""
    paths = [*launch.code_dirs, *(m.source for m in launch.mounts)]
    paths += [source for source, _ in launch.daemon_binds]
    paths.append(launch.workspace if launch.root is None else launch.root)
    if launch.pycache is not None:
        paths.append(launch.pycache)
    if launch.etc_dir is not None:
        paths += [launch.etc_dir / name for name in sorted(os.listdir(launch.etc_dir))]
    return paths


# Run as root in a private mount namespace (``unshare --mount``): a small tmpfs on the stage
# folder, each source bind-mounted onto ``<stage>/<n>``, then the rest of argv (setpriv + bwrap).
# Each source comes with the ``dev:ino`` its bound folder must have, or ``-``: mount resolves the
# path again, so what it bound is checked afterwards (a mount cannot be swapped, a name can).
_STAGE_SCRIPT = """set -e
stage=$1; shift
mount -t tmpfs -o mode=0755,size=64k,nosuid,nodev torpor-stage "$stage"
i=0
while [ "$1" != "--" ]; do
  if [ -d "$1" ]; then mkdir "$stage/$i"; else : > "$stage/$i"; fi
  mount --bind "$1" "$stage/$i"
  if [ "$2" != - ] && [ "$(stat -c %d:%i "$stage/$i")" != "$2" ]; then
    echo "torpor-stage: refused: $1 is not the folder checked beneath the data dir" \
      "(a name on its way was swapped, e.g. for a symlink)" >&2
    exit 1
  fi
  i=$((i + 1)); shift 2
done
shift
unset PWD OLDPWD  # sh exports them; the pod's PID 1 gets exactly the spawn environment
exec "$@"
"""


def stage_prefix(
    stage: Path, sources: Sequence[Path], identities: Mapping[Path, str] | None = None
) -> tuple[list[str], dict[Path, str]]:
    """Argv prefix that makes ``sources`` reachable for an unprivileged bwrap, and where.

    The host folders above a data dir or an interpreter may be closed to other users (``/root``
    is 0700), and bwrap resolves every bind source as the uid it runs as. The prefix binds each
    source onto a world-traversable stage inside a mount namespace of the pod's own (so nothing
    appears on the host and everything goes with the pod), then execs the rest. A source in
    ``identities`` must bind the folder of that ``dev:ino`` (see :class:`Mount`)."""
    known = identities or {}
    unique = list(dict.fromkeys(sources))
    staged = {source: str(stage / str(i)) for i, source in enumerate(unique)}
    prefix = [
        *mounts.private_shell(_STAGE_SCRIPT, "torpor-stage"),
        str(stage),
        *(part for source in unique for part in (str(source), known.get(source, "-"))),
        "--",
    ]
    return prefix, staged


def check_env(env: Mapping[str, str]) -> None:
    """Refuse environment entries that could become something else on the way into the pod: a
    NUL ends a token of ``--args`` (the rest would be read as bwrap options), ``=`` in a name
    splits it differently, an empty name is no variable. The API refuses them too; this holds
    for every caller of the runtime."""
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            msg = f"invalid environment variable {key[:64]!r}: empty name, '=' in name or NUL"
            raise RuntimeFailure(msg)


def setpriv_path() -> str:
    path = shutil.which("setpriv")
    if path is None:
        msg = "setpriv (util-linux) is not installed: apt-get install -y util-linux"
        raise ConfigError(msg)
    return path


def is_within(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(Path(folder).resolve())
    except ValueError:
        return False
    return True


def daemon_package() -> tuple[Path, Path]:
    """The daemon's own package on the host: ``services/envd`` and ``services/__init__.py``
    (not the rest of torpor's source tree)."""
    spec = importlib.util.find_spec("services.envd")
    if spec is None or spec.origin is None:
        msg = "the in-sandbox daemon (services.envd) is not installed"
        raise ConfigError(msg)
    envd = Path(spec.origin).resolve().parent
    return envd, envd.parent / "__init__.py"


def code_dirs(*, package: bool = True) -> list[Path]:
    """What ``python -m services.envd`` needs, read-only, each bound at its own path: the
    interpreter, the venv and (with ``package``) the daemon's own package (see
    :func:`daemon_package`)."""
    paths = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}
    if package:
        paths.update(daemon_package())
    system = [Path(d).resolve() for d in SYSTEM_DIRS if os.path.isdir(d)]
    # Drop paths already visible through a system bind or another code path.
    kept = [
        p
        for p in paths
        if not any(is_within(p, s) for s in system)
        and not any(p != o and is_within(p, o) for o in paths)
    ]
    return sorted(kept)


def open_args_file(path: Path, data: bytes) -> int:
    """bwrap's ``--args`` (options and the pod's environment) in an unlinked 0600 file (no size
    limit, unlike a pipe written before the reader starts): a descriptor at its start, to be
    passed to the pod. Nothing stays on disk."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.unlink(path)
        while data:
            data = data[os.write(fd, data) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd
