"""Template layers stored in the layer range (.layer_ids): the id rule, the shift walk, the mark."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shared.runtime.local import layer_ids, userns

BASE = layer_ids.LAYER_BASE


def test_the_layer_range_is_below_every_pod_range_and_above_real_users() -> None:
    assert layer_ids.IDS == userns.IDS_PER_POD
    assert BASE + layer_ids.IDS == userns.FIRST_BASE
    assert BASE > 2**29  # far above host users and subuid ranges (100000+)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, BASE),
        (1000, BASE + 1000),
        (65535, BASE + 65535),
        (BASE + 7, BASE + 7),  # stored already: a repeat after a crash changes nothing
        (65536, BASE),  # outside the sandbox's range: its root, never a host id
        (-1, BASE),
        (2**32 - 1, BASE),
        (userns.FIRST_BASE, BASE),  # a pod range's id
    ],
)
def test_stored_maps_every_id_into_the_layer_range(value: int, expected: int) -> None:
    assert layer_ids.stored(value) == expected


def _layer(tmp_path: Path) -> Path:
    folder = tmp_path / "layer"
    tree = folder / "tree"
    (tree / "home" / "user").mkdir(parents=True)
    (tree / "home" / "user" / "f").write_text("x")
    os.chown(tree / "home" / "user", 1000, 1000)
    os.chown(tree / "home" / "user" / "f", 1000, 1000)
    return folder


def test_store_shifts_every_entry_marks_the_layer_and_follows_no_link(tmp_path: Path) -> None:
    host = tmp_path / "host-file"
    host.write_text("host")
    os.chown(host, 0, 0)
    folder = _layer(tmp_path)
    tree = folder / "tree"
    os.symlink(host, tree / "abs-link")
    os.symlink("../../host-file", tree / "rel-link")
    assert not layer_ids.is_stored(tree)
    assert layer_ids.offset(tree) == 0
    layer_ids.store(folder)
    assert layer_ids.is_stored(tree)
    assert layer_ids.offset(tree) == BASE
    assert os.stat(host).st_uid == 0  # the links' target is untouched
    assert os.lstat(tree / "abs-link").st_uid == BASE  # the link itself is the layer's
    assert os.stat(tree / "home" / "user" / "f").st_uid == BASE + 1000
    assert os.stat(tree).st_uid == BASE
    layer_ids.store(folder)  # again: nothing moves
    assert os.stat(tree / "home" / "user").st_gid == BASE + 1000


@pytest.mark.parametrize("mark", ["0\n", "", "\x00", f"{BASE + 1}\n", "x" * 5000])
def test_a_wrong_mark_is_no_mark(tmp_path: Path, mark: str) -> None:
    folder = _layer(tmp_path)
    (folder / layer_ids.MARK).write_text(mark)
    assert not layer_ids.is_stored(folder / "tree")


def test_a_mark_that_is_a_symlink_is_not_trusted(tmp_path: Path) -> None:
    folder = _layer(tmp_path)
    (tmp_path / "elsewhere").write_text(f"{BASE}\n")
    os.symlink(tmp_path / "elsewhere", folder / layer_ids.MARK)
    assert not layer_ids.is_stored(folder / "tree")
    with pytest.raises(OSError):  # store never writes through a link
        layer_ids.store(folder)
    assert (tmp_path / "elsewhere").read_text() == f"{BASE}\n"


def test_mapping_start_stores_an_unmounted_legacy_layer(tmp_path: Path) -> None:
    folder = _layer(tmp_path)
    with layer_ids.mapping_start(folder / "tree") as inner:
        assert inner == BASE
    assert layer_ids.is_stored(folder / "tree")
    assert os.stat(folder / "tree" / "home" / "user" / "f").st_uid == BASE + 1000
