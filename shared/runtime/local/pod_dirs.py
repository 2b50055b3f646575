"""A pod's folder (``<data dir>/pods/<uid>``): its root (the rootfs under a built template's
layers under the sandbox's layer), finding and unmounting what it mounted, and removing it."""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

import structlog

from shared.runtime.local import layer_ids, mounts, pod_commands, userns, volume_fs
from shared.runtime.local.daemon_python import DaemonPython

log = structlog.get_logger()


# In a pod folder: which upper layer its mounted ``root`` is over, and that overlay's device
# (overlayfs' options name no host path, see mounts.mount_overlay, so they cannot tell it).
_ROOT_NOTE = "root.json"


def mount_pod_root(lowers: Sequence[Path], upper: Path, work: Path, pod_dir: Path) -> None:
    """The overlay of ``lowers`` under ``upper`` on ``<pod dir>/root``, and its note."""
    root = pod_dir / "root"
    mounts.mount_overlay(lowers, upper, work, root)
    note = {"upper": str(upper), "dev": os.stat(root).st_dev}
    partial = pod_dir / f"{_ROOT_NOTE}.partial"
    partial.write_text(json.dumps(note))
    os.rename(partial, pod_dir / _ROOT_NOTE)


def root_upper_is(pid: int, pod_dir: Path, upper: Path) -> bool:
    """Whether the root of pod process ``pid`` is the overlay over ``upper`` mounted on
    ``<pod dir>/root``: the same filesystem (an overlay's device is its own) as the one its
    note says is over ``upper``."""
    try:
        note = json.loads((pod_dir / _ROOT_NOTE).read_text())
        if note["upper"] != str(upper):
            return False
        dev = os.stat(f"/proc/{pid}/root").st_dev
        return bool(dev == note["dev"] == os.stat(pod_dir / "root").st_dev)
    except (OSError, ValueError, KeyError, TypeError):
        return False


_FILES_BYTES = 2**20


def files_dir(pod_dir: Path) -> Path:
    """``<pod dir>/files``: a small tmpfs of the pod's own (see :func:`mount_files`) holding the
    files bound into it one by one: ``etc/`` (.etc) and ``boot_id``."""
    return pod_dir / "files"


def mount_files(pod_dir: Path) -> Path:
    """Mount the pod's :func:`files_dir`. A bind of a single file shows, in the pod's mount
    table, the file's path inside its filesystem: on the data dir's filesystem that named the
    data dir; on this tmpfs it is ``/etc/hostname``."""
    files = files_dir(pod_dir)
    files.mkdir(mode=0o755, exist_ok=True)
    if not mounts.is_mounted(files):
        mounts.mount_tmpfs(files, size=_FILES_BYTES, owner=0, name="torpor-files")
    return files


def read_only_mounts(pod_dir: Path) -> list[Path]:
    """Where :func:`mount_daemon` mounts (``<pod dir>/ro/<name>``)."""
    return [pod_dir / "ro" / name for name in ("envd", "pycache", "py")]


def mount_daemon(
    pod_dir: Path, envd: Path, package_init: Path, pycache: Path, daemon: DaemonPython
) -> list[tuple[Path, str]]:
    """The daemon's interpreter (see .daemon_python), package and bytecode for the pod: (host
    source, path inside) of each bind.
    The folders are read-only overlays of their own (see mounts.mount_read_only): a bind of a
    host folder shows, in the pod's mount table, that folder's path inside its filesystem (the
    checkout's, the venv's or the data dir's); ``services/__init__.py`` is copied into the
    pod's files (mtime kept: its bytecode stays valid)."""
    ro = pod_dir / "ro"
    empty = ro / "empty"
    empty.mkdir(mode=0o755, parents=True, exist_ok=True)
    for source, target in zip((envd, pycache, daemon.tree), read_only_mounts(pod_dir), strict=True):
        target.mkdir(mode=0o755, exist_ok=True)
        if not mounts.is_mounted(target):
            mounts.mount_read_only(source, empty, target)
    init = files_dir(pod_dir) / "services-init.py"
    shutil.copy2(package_init, init)
    shim = files_dir(pod_dir) / "python"
    shim.write_text(pod_commands.python_shim(daemon.executable))
    shim.chmod(0o755)
    code = pod_commands.DAEMON_CODE
    return [
        (ro / "envd", f"{code}/services/envd"),
        (init, f"{code}/services/__init__.py"),
        (ro / "pycache", pod_commands.DAEMON_PYCACHE),
        (ro / "py", pod_commands.DAEMON_PY),
        (shim, pod_commands.PYTHON_SHIM),
    ]


def remove_pod_dir(pod_dir: Path) -> None:
    """Remove a pod folder, never following a symlink (rmtree's fd-based walk does not)."""
    try:
        st = os.lstat(pod_dir)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        log.error("runtime_local_pod_dir_not_a_folder", pod_dir=str(pod_dir))
        return
    for mounted in [
        *(pod_dir / m for m in ("workspace", "root", "lower", "files")),
        *read_only_mounts(pod_dir),
        *template_lowers(pod_dir),
    ]:
        # Never remove through a mount: ``root`` holds the sandbox's kept files.
        if mounts.is_mounted(mounted):
            log.error("runtime_local_pod_dir_still_mounted", pod_dir=str(pod_dir), at=str(mounted))
            return
    shutil.rmtree(pod_dir, ignore_errors=True)


def template_lowers(pod_dir: Path) -> list[Path]:
    try:
        return sorted(pod_dir.glob("lower-[0-9]*"))
    except OSError:
        return []


def mount_root(
    rootfs: Path, layer: Path, pod_dir: Path, base: int, template_layers: Sequence[Path] = ()
) -> None:
    """``<pod dir>/root``: the rootfs, id-mapped into the pod's range (read-only), under the
    read-only layers of a template users built (``lower-<i>``, each id-mapped from the layer
    range, .layer_ids), under the layer's ``upper`` (see .layers and .mounts)."""
    lower, root = pod_dir / "lower", pod_dir / "root"
    lower.mkdir(mode=0o700, exist_ok=True)
    root.mkdir(mode=0o755, exist_ok=True)
    stack = []
    mappings: dict[int, int] = {}  # first on-disk id -> a mapping namespace's descriptor

    def mapping(inner: int) -> int:
        if inner not in mappings:
            mappings[inner] = mounts.mapping_userns(base, userns.IDS_PER_POD, inner=inner)
        return mappings[inner]

    try:
        mounts.idmapped_clone(rootfs, lower, userns_fd=mapping(0))
        for i, tree in enumerate(template_layers):
            target = pod_dir / f"lower-{i}"
            target.mkdir(mode=0o700, exist_ok=True)
            with layer_ids.mapping_start(tree) as inner:
                mounts.idmapped_clone(tree, target, userns_fd=mapping(inner))
            stack.append(target)
    finally:
        for fd in mappings.values():
            os.close(fd)
    # overlayfs: the leftmost lower layer is the top one.
    mount_pod_root([*reversed(stack), lower], layer / "upper", layer / "work", pod_dir)


def unmount_stopped(data_dir: Path) -> int:
    """Unmount what the pods of ``data_dir`` left mounted (roots, lowers, workspaces, layers),
    once every one of them is stopped: a shutdown that only kills them (``torpor up``'s, the
    tests' ``Stack.stop``) left them until the instance's next start, or for ever when the data
    dir was deleted meanwhile. Returns how many mount points there were."""
    # PodLauncher.pods_dir and Layers.root; then the volumes' filesystem (.volume_fs).
    count = sum(mounts.unmount_under(data_dir / sub) for sub in ("pods", "layers"))
    if volume_fs.is_mounted(data_dir):
        volume_fs.unmount(data_dir)
        count += 1
    return count
