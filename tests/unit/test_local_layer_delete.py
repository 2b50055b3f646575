"""Several runtimes on one bucket delete a gone sandbox's layer at once (shared/runtime/local/
layers.py ``Layers.delete``): one moves it aside and removes it, the others find nothing and
never fail (CI: a second runtime's delete failed with FileNotFoundError between its look and its
lstat)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from shared.runtime.local.layers import Layers

pytestmark = pytest.mark.unit


def test_concurrent_deletes_of_one_layer_never_fail(tmp_path: Path) -> None:
    layers = Layers(tmp_path)
    errors: list[BaseException] = []
    for round_ in range(150):
        name = f"sbx-race-{round_}"
        folder = layers.folder(name)
        (folder / "mnt" / "upper").mkdir(parents=True)
        (folder / "mnt" / "upper" / "kept.txt").write_text("x")
        start = threading.Barrier(4)

        def delete() -> None:
            start.wait()
            try:
                layers.delete(name)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=delete) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not folder.exists()
    assert errors == []
    assert [p.name for p in layers.root.iterdir()] == []  # nothing left aside either


def test_a_layer_that_is_a_file_or_missing_is_handled(tmp_path: Path) -> None:
    layers = Layers(tmp_path)
    layers.delete("sbx-never-made")  # nothing there: nothing to do
    layers.root.mkdir()
    (layers.root / "sbx-a-file").write_text("not a layer")
    layers.delete("sbx-a-file")
    assert not (layers.root / "sbx-a-file").exists()
