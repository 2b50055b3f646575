"""Template layers on disk (local runtime), fast tier: a hostile build-context archive cannot
write outside its layer, COPY keeps the owners of the folders it passes through, and an
exported layer's ids are shifted once (a nested folder is not its root's)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path, PurePosixPath

import pytest

from shared.errors import RuntimeFailure
from shared.runtime.local import template_layers
from shared.runtime.local.layers import shift_ids
from tests.templates.copying import copy_step

pytestmark = pytest.mark.unit


def _tar(path: Path, members: list[tarfile.TarInfo], data: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info in members:
            payload = data.get(info.name)
            tar.addfile(info, io.BytesIO(payload) if payload is not None else None)
    return path


def _file(name: str, data: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info


def _copy(tmp_path: Path, archive: Path, src: str, dest: str) -> Path:
    home = tmp_path / "lower" / "home" / "user"  # in the step's lower: /home/user is 1000's
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, 1000, 1000)
    return copy_step(tmp_path, archive, src, dest)


def test_a_hostile_archive_writes_nothing_outside(tmp_path: Path) -> None:
    member = _file("../escape.txt", b"x")
    archive = _tar(tmp_path / "a.tar.gz", [member], {member.name: b"x"})
    with pytest.raises(RuntimeFailure):
        _copy(tmp_path, archive, "*", "/opt/")
    assert not list(tmp_path.rglob("escape.txt"))


def test_an_absolute_member_is_refused(tmp_path: Path) -> None:
    member = _file("/etc/torpor-escape-test.txt", b"x")
    archive = _tar(tmp_path / "a.tar.gz", [member], {member.name: b"x"})
    with pytest.raises(RuntimeFailure, match="absolute"):
        _copy(tmp_path, archive, "*", "/opt/")
    assert not Path("/etc/torpor-escape-test.txt").exists()
    assert not list(tmp_path.rglob("torpor-escape-test.txt"))


def test_a_hard_link_out_of_the_archive_is_refused(tmp_path: Path) -> None:
    hard = tarfile.TarInfo("hard")
    hard.type = tarfile.LNKTYPE
    hard.linkname = "../../../etc/passwd"
    archive = _tar(tmp_path / "hard.tar.gz", [hard], {})
    with pytest.raises(RuntimeFailure):
        _copy(tmp_path, archive, "*", "/opt/")


def test_a_symlink_is_copied_as_a_link_and_never_followed(tmp_path: Path) -> None:
    link = tarfile.TarInfo("etc-link")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc"
    through = _file("etc-link/torpor-escape-test", b"x")  # written through the link: refused
    archive = _tar(tmp_path / "a.tar.gz", [link, through], {through.name: b"x"})
    with pytest.raises(RuntimeFailure):
        _copy(tmp_path / "a", archive, "*", "/opt/")
    assert not Path("/etc/torpor-escape-test").exists()
    # alone, the link is kept as a link (a name inside the sandbox, as E2B keeps it) ...
    archive = _tar(tmp_path / "b.tar.gz", [link], {})
    tree = _copy(tmp_path / "b", archive, "*", "/opt/")
    assert os.readlink(tree / "opt" / "etc-link") == "/etc"
    # ... and a COPY source through it cannot reach the host's files
    with pytest.raises(RuntimeFailure):
        _copy(tmp_path / "c", archive, "etc-link/hostname", "/opt/")


@pytest.mark.parametrize("src", ["../x", "/etc/passwd"])
def test_a_source_outside_the_context_is_refused(tmp_path: Path, src: str) -> None:
    archive = _tar(tmp_path / "a.tar.gz", [_file("ok.txt", b"x")], {"ok.txt": b"x"})
    with pytest.raises(RuntimeFailure):
        _copy(tmp_path, archive, src, "/opt/")


def test_copy_keeps_the_owner_of_folders_it_passes_through(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "a.tar.gz", [_file("app/c.txt", b"hi")], {"app/c.txt": b"hi"})
    tree = _copy(tmp_path, archive, "app/c.txt", "app/config.txt")
    assert (tree / "home/user/app/config.txt").read_bytes() == b"hi"
    assert os.stat(tree / "home/user").st_uid == 1000  # as below: her home stays hers
    assert os.stat(tree / "home").st_uid == 0
    assert os.stat(tree / "home/user/app/config.txt").st_uid == 1000


def test_make_parents_refuses_a_file_in_the_way(tmp_path: Path) -> None:
    lower = tmp_path / "lower"
    lower.mkdir()
    (lower / "opt").write_text("a file")
    (tmp_path / "t").mkdir()
    with pytest.raises(RuntimeFailure):
        template_layers.make_parents(tmp_path / "t", PurePosixPath("/opt/x"), [lower], owner=0)


def test_shift_ids_moves_every_entry_once(tmp_path: Path) -> None:
    base = 1 << 30
    nested = tmp_path / "root" / "home" / "user"
    nested.mkdir(parents=True)
    (nested / "f").write_text("x")
    os.symlink("/nowhere", tmp_path / "root" / "link")
    for p in (tmp_path / "root", tmp_path / "root" / "home", nested, nested / "f"):
        os.chown(p, base + 1000, base + 1000)
    shift_ids(tmp_path / "root", -base, base=0)
    assert os.stat(nested).st_uid == 1000
    assert os.stat(nested / "f").st_uid == 1000
    assert os.stat(tmp_path / "root" / "home").st_uid == 1000
