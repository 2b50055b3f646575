"""A legacy (unshifted) template layer that a running pod still mounts is left as it is: shifting
it would change the owners that pod's sandbox sees. Mounts are real (an id-mapped clone, as
``pod_dirs.mount_root`` makes); needs root."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from shared.runtime.local import layer_ids, mounts
from tests.conftest import skip_or_fail

POD_BASE = 1 << 30


@contextlib.contextmanager
def _clone(tree: Path, target: Path, *, inner: int) -> Iterator[None]:
    """``tree`` on ``target`` as a pod's lower, its ids from ``inner`` on in the pod's range."""
    fd = mounts.mapping_userns(POD_BASE, 65536, inner=inner)
    try:
        mounts.idmapped_clone(tree, target, userns_fd=fd)
    finally:
        os.close(fd)
    try:
        yield
    finally:
        mounts.unmount(target)


def test_a_legacy_layer_a_pod_mounts_is_mapped_as_before_and_shifted_once_free(
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0:
        skip_or_fail("needs root (mounts)")
    tree = tmp_path / "layers" / "k" / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "f").write_text("x")
    os.chown(tree / "etc" / "f", 1000, 1000)
    target = tmp_path / "pods" / "p" / "lower-0"
    target.mkdir(parents=True)
    with _clone(tree, target, inner=0):
        assert os.stat(target / "etc" / "f").st_uid == POD_BASE + 1000
        with layer_ids.mapping_start(tree) as inner:
            assert inner == 0  # mapped as the running pod's: same owners for both
        assert not layer_ids.is_stored(tree)
        assert os.stat(tree / "etc" / "f").st_uid == 1000
    with layer_ids.mapping_start(tree) as inner:
        assert inner == layer_ids.LAYER_BASE
    assert os.stat(tree / "etc" / "f").st_uid == layer_ids.LAYER_BASE + 1000
    # a clone mapped from the layer range shows the sandbox's ids in the pod's range
    with _clone(tree, target, inner=layer_ids.LAYER_BASE):
        assert os.stat(target / "etc" / "f").st_uid == POD_BASE + 1000
