"""A pod's folder (``<data dir>/pods/<uid>``): its root (the rootfs under a built template's
layers under the sandbox's layer), finding and unmounting what it mounted, and removing it."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

import structlog

from shared.runtime.local import layer_ids, mounts, userns

log = structlog.get_logger()


def root_upper_is(pid: int, upper: Path) -> bool:
    """Whether the root of pod process ``pid`` is the overlay over ``upper``."""
    wanted = f"upperdir={upper},"
    with open(f"/proc/{pid}/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split(" ")
            if len(fields) > 4 and fields[4] == "/" and wanted in line:
                return True
    return False


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
        *(pod_dir / m for m in ("workspace", "root", "lower")),
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
    mounts.mount_overlay([*reversed(stack), lower], layer / "upper", layer / "work", root)


def unmount_stopped(data_dir: Path) -> int:
    """Unmount what the pods of ``data_dir`` left mounted (roots, lowers, workspaces, layers),
    once every one of them is stopped: a shutdown that only kills them (``torpor up``'s, the
    tests' ``Stack.stop``) left them until the instance's next start, or for ever when the data
    dir was deleted meanwhile. Returns how many mount points there were."""
    # PodLauncher.pods_dir and Layers.root.
    return sum(mounts.unmount_under(data_dir / sub) for sub in ("pods", "layers"))
