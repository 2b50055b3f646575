"""A running sandbox swaps a folder of its layer for a symlink to a host folder while the host
copies that layer into a snapshot (``snapshot_files.save``, run as host root over a live
sandbox's upper dir): the snapshot never holds a host file, and nothing on the host changes.

The racing sandbox is a thread here, doing what root in the sandbox can do to its own upper dir
(rename a folder away, put a symlink in its place, put it back) as fast as it can, while the
real ``save`` copies. The host folder holds files with the same names as the swapped folder's,
so a copy that follows the symlink (``cp -a`` resolves every folder on the way by path) reads
the host's contents into the snapshot."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from shared.errors import RuntimeFailure
from shared.models.snapshot_records import new_snapshot_id
from shared.runtime.local import snapshot_files
from tests.support.host_state import tree_state

FILES = 2000
ROUNDS = 4


def _swapper(upper: Path, host: Path, stop: threading.Event) -> None:
    folder, aside = upper / "d", upper / "d.aside"
    while not stop.is_set():
        with contextlib.suppress(OSError):
            os.rename(folder, aside)
            os.symlink(str(host), folder)
            time.sleep(0.002)  # long enough for a copy to go through it
            os.unlink(folder)
            os.rename(aside, folder)
            time.sleep(0.002)


def test_a_folder_swapped_for_a_symlink_during_a_snapshot_copy_leaks_no_host_file(
    tmp_path: Path,
) -> None:
    host = tmp_path / "host"
    host.mkdir(mode=0o700)
    upper = tmp_path / "upper"
    (upper / "d").mkdir(parents=True)
    for i in range(FILES):
        (host / f"f{i}").write_text(f"HOST SECRET {i}\n")
        os.chmod(host / f"f{i}", 0o600)
        (upper / "d" / f"f{i}").write_text(f"sandbox {i}\n")
    before = tree_state(host)
    data_dir = tmp_path / "data"
    data_dir.mkdir()

    @contextlib.contextmanager
    def layer() -> Iterator[Path]:
        yield upper

    leaked: list[str] = []
    saved = 0
    for _ in range(ROUNDS):
        stop = threading.Event()
        racer = threading.Thread(target=_swapper, args=(upper, host, stop), daemon=True)
        racer.start()
        snapshot_id = new_snapshot_id()
        try:
            snapshot_files.save(data_dir, snapshot_id, layer=layer(), volumes={}, id_base=0)
            saved += 1
        except RuntimeFailure:
            pass  # a copy that met the symlink may fail; it may never read through it
        finally:
            stop.set()
            racer.join()
        copy = snapshot_files.snapshot_dir(data_dir, snapshot_id)
        leaked += [
            str(p)
            for p in copy.rglob("*")
            if p.is_file() and not p.is_symlink() and b"HOST SECRET" in p.read_bytes()
        ]
    assert not leaked, f"{len(leaked)} host files copied into snapshots, e.g. {leaked[:3]}"
    assert tree_state(host) == before
    assert saved, "no snapshot was saved: the race test proved nothing"
