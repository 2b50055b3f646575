"""A hostile build context against the builder's COPY (``template_layers.copy_in``, the function
the builder runs as host root), fast tier: a symlink planted by an earlier glob match or an
earlier step, symlink members, hard links, the long-path bypass of tarfile's filter
(CVE-2025-4517), devices and FIFOs, tar bombs by size and by member count. Nothing outside the
layer changes: a host sentinel folder is checked for content, owner, mode and existence."""

from __future__ import annotations

import contextlib
import os
import stat
import tarfile
from pathlib import Path

import pytest

from shared.errors import RuntimeFailure
from shared.runtime.local import template_layers
from tests.support.host_state import tree_state
from tests.support.tar_members import member as _member
from tests.support.tar_members import write_tar
from tests.templates.copying import copy_step

pytestmark = pytest.mark.unit


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host folder no COPY may touch: a file, a folder, both root's and private."""
    folder = tmp_path / "host"
    (folder / "dir").mkdir(parents=True)
    (folder / "secret").write_text("host secret\n")
    os.chmod(folder / "secret", 0o600)
    os.chmod(folder / "dir", 0o700)
    return folder


def _relative_to_host(host: Path, depth: int) -> str:
    """A relative link text from a folder ``depth`` levels under ``tmp_path`` to ``host``."""
    return "../" * depth + host.name


@pytest.mark.parametrize("link", ["absolute", "relative", "nested"])
def test_a_later_match_never_writes_through_a_symlink_an_earlier_match_planted(
    tmp_path: Path, host: Path, link: str
) -> None:
    """Glob matches copy in order: ``a`` plants ``opt/app/s -> host`` in the layer, ``b``
    brings a folder ``s`` holding a file named like the host's, a new file and a folder."""
    before = tree_state(host)
    # layer/opt/app/s: its parent is 3 levels under tmp_path; nested: layer/opt/app/n/s, 4.
    prefix = "n/" if link == "nested" else ""
    text = str(host) if link == "absolute" else _relative_to_host(host, 4 if prefix else 3)
    members: list[tuple[tarfile.TarInfo, bytes | None]] = [
        (_member("a", tarfile.DIRTYPE), None),
        *([(_member("a/n", tarfile.DIRTYPE), None)] if prefix else []),
        (_member(f"a/{prefix}s", tarfile.SYMTYPE, linkname=text), None),
        (_member("b", tarfile.DIRTYPE), None),
        *([(_member("b/n", tarfile.DIRTYPE), None)] if prefix else []),
        (_member(f"b/{prefix}s", tarfile.DIRTYPE, mode=0o777), None),
        (_member(f"b/{prefix}s/secret", mode=0o4777), b"tenant wrote this\n"),
        (_member(f"b/{prefix}s/new"), b"tenant file\n"),
        (_member(f"b/{prefix}s/dir", tarfile.DIRTYPE), None),
        (_member(f"b/{prefix}s/dir/deep"), b"deep\n"),
    ]
    archive = write_tar(tmp_path / "a.tar", members)
    tree = copy_step(tmp_path, archive, "*", "/opt/app/")
    assert tree_state(host) == before
    landed = tree / "opt/app" / prefix / "s"
    assert landed.is_dir() and not landed.is_symlink()  # the later match replaced the link
    assert (landed / "secret").read_text() == "tenant wrote this\n"
    assert stat.S_IMODE((landed / "secret").stat().st_mode) == 0o777  # setuid stripped
    assert (landed / "dir/deep").read_text() == "deep\n"
    assert (landed / "new").stat().st_uid == 1000


def test_a_symlink_to_a_host_file_is_replaced_not_written_through(
    tmp_path: Path, host: Path
) -> None:
    before = tree_state(host)
    members: list[tuple[tarfile.TarInfo, bytes | None]] = [
        (_member("a", tarfile.DIRTYPE), None),
        (_member("a/f", tarfile.SYMTYPE, linkname=str(host / "secret")), None),
        (_member("b", tarfile.DIRTYPE), None),
        (_member("b/f", tarfile.DIRTYPE), None),  # a folder where the link was: rmtree of it
        (_member("b/f/x"), b"x"),
    ]
    tree = copy_step(tmp_path, write_tar(tmp_path / "a.tar", members), "*", "/opt/")
    assert tree_state(host) == before
    assert (tree / "opt/f/x").read_bytes() == b"x"


def test_a_symlink_planted_by_an_earlier_step_is_never_passed(tmp_path: Path, host: Path) -> None:
    """An earlier layer (a RUN step's or a COPY's) holds ``/opt/app -> host``: a COPY to
    ``/opt/app/`` is refused and writes nothing there."""
    before = tree_state(host)
    earlier = tmp_path / "earlier"
    (earlier / "opt").mkdir(parents=True)
    os.symlink(str(host), earlier / "opt" / "app")
    archive = write_tar(tmp_path / "a.tar", [(_member("secret"), b"tenant\n")])
    with pytest.raises(RuntimeFailure, match=r"not a folder|symlink"):
        copy_step(tmp_path, archive, "secret", "/opt/app/", lowers=[earlier])
    with pytest.raises(RuntimeFailure, match=r"not a folder|symlink"):
        copy_step(tmp_path, archive, "secret", "/opt/app/sub/", lowers=[earlier])
    assert tree_state(host) == before


@pytest.mark.parametrize("target", ["absolute", "relative"])
def test_a_member_through_a_symlink_member_is_refused(
    tmp_path: Path, host: Path, target: str
) -> None:
    before = tree_state(host)
    text = str(host) if target == "absolute" else _relative_to_host(host, 2)  # scratch/context
    members: list[tuple[tarfile.TarInfo, bytes | None]] = [
        (_member("l", tarfile.SYMTYPE, linkname=text), None),
        (_member("l/secret", mode=0o777), b"overwritten\n"),
    ]
    with pytest.raises(RuntimeFailure):
        copy_step(tmp_path, write_tar(tmp_path / "a.tar", members), "*", "/opt/")
    assert tree_state(host) == before


def test_the_long_path_filter_bypass_cve_2025_4517_is_refused(tmp_path: Path, host: Path) -> None:
    """The published proof of concept: symlinks through folders with 247-byte names until the
    path outgrows PATH_MAX and ``os.path.realpath`` stops resolving, then a link out of the
    context; through it a file is written (and chmodded) and a hard link made to a host file,
    whose content a COPY would put in the layer."""
    before = tree_state(host)
    comp = "d" * 247
    steps = "abcdefghijklmnop"
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    path = ""
    for step in steps:
        members.append((_member(os.path.join(path, comp), tarfile.DIRTYPE), None))
        members.append((_member(os.path.join(path, step), tarfile.SYMTYPE, linkname=comp), None))
        path = os.path.join(path, comp)
    linkpath = os.path.join(*steps, "l" * 254)
    members.append((_member(linkpath, tarfile.SYMTYPE, linkname="../" * len(steps)), None))
    # The context is tmp_path/scratch/context: two levels up is tmp_path.
    members.append(
        (_member("escape", tarfile.SYMTYPE, linkname=f"{linkpath}/../../{host.name}"), None)
    )
    members.append((_member("escape/secret", mode=0o777), b"overwritten\n"))
    members.append((_member("leak", tarfile.LNKTYPE, linkname="escape/dir/../secret"), None))
    members.append((_member("leak2", tarfile.LNKTYPE, linkname="escape/secret"), None))
    archive = write_tar(tmp_path / "a.tar", members)
    with contextlib.suppress(RuntimeFailure):  # refused, or copied harmlessly: either is fine
        copy_step(tmp_path, archive, "leak*", "/opt/")
    assert tree_state(host) == before
    assert not [
        p for p in (tmp_path / "layer").rglob("*") if p.is_file() and b"host" in p.read_bytes()
    ]


@pytest.mark.parametrize(
    ("name", "member"),
    [
        ("to a symlink", _member("hard", tarfile.LNKTYPE, linkname="sym")),
        ("to a folder", _member("hard", tarfile.LNKTYPE, linkname="folder")),
        ("out with ..", _member("hard", tarfile.LNKTYPE, linkname="../host/secret")),
        ("absolute", _member("hard", tarfile.LNKTYPE, linkname="/etc/passwd")),
        ("not yet unpacked", _member("hard", tarfile.LNKTYPE, linkname="later")),
        ("a FIFO", _member("fifo", tarfile.FIFOTYPE)),
        ("a character device", _member("dev", tarfile.CHRTYPE, devmajor=1, devminor=3)),
        ("a block device", _member("dev", tarfile.BLKTYPE, devmajor=8, devminor=0)),
    ],
)
def test_links_out_devices_and_fifos_are_refused(
    tmp_path: Path, host: Path, name: str, member: tarfile.TarInfo
) -> None:
    before = tree_state(host)
    members: list[tuple[tarfile.TarInfo, bytes | None]] = [
        (_member("sym", tarfile.SYMTYPE, linkname=str(host / "secret")), None),
        (_member("folder", tarfile.DIRTYPE), None),
        (member, None),
        (_member("later"), b"later\n"),
    ]
    with pytest.raises(RuntimeFailure):
        copy_step(tmp_path, write_tar(tmp_path / "a.tar", members), "*", "/opt/")
    assert tree_state(host) == before, name
    assert not list((tmp_path / "layer").rglob("*"))


def test_a_tar_bomb_by_size_is_refused_before_it_is_written(tmp_path: Path) -> None:
    """A PAX sparse member claiming 9 GiB (a few bytes in the archive): refused at its header,
    the context's bound (8 GiB) passed; nothing that big is ever written."""
    archive = tmp_path / "bomb.tar"
    sparse_map = b"1\n0\n1\n".ljust(512, b"\0")
    info = _member("GNUSparseFile.0/big")
    info.pax_headers = {
        "GNU.sparse.major": "1",
        "GNU.sparse.minor": "0",
        "GNU.sparse.name": "big",
        "GNU.sparse.realsize": str(9 * 2**30),
    }
    write_tar(archive, [(info, sparse_map + b"x")])
    with tarfile.open(archive) as tar:
        assert tar.getmembers()[0].size == 9 * 2**30  # the bomb as tarfile sees it
    with pytest.raises(RuntimeFailure, match=r"more than \d+ bytes"):
        copy_step(tmp_path, archive, "nothing-matches", "/opt/")
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size > 2**20]


def test_a_tar_bomb_by_member_count_is_refused(tmp_path: Path) -> None:
    """The bound is 100 000 members; here a small one, so the test stays fast."""
    archive = tmp_path / "many.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("f")
        for i in range(1000):
            info.name = f"f{i}"
            tar.addfile(info)
    limits = template_layers.ContextLimits(members=100)
    with pytest.raises(RuntimeFailure, match="more than 100 entries"):
        copy_step(tmp_path, archive, "f1", "/opt/", limits=limits)
    assert len(os.listdir(tmp_path / "scratch" / "context")) == 100  # stopped at the bound
    assert template_layers.ContextLimits().members == 100_000


def test_a_path_longer_than_the_bound_is_refused(tmp_path: Path) -> None:
    deep = "/".join(["x" * 200] * 6)  # 1205 bytes
    archive = write_tar(tmp_path / "a.tar", [(_member(deep), b"x")])
    with pytest.raises(RuntimeFailure, match="longer than 1024 bytes"):
        copy_step(tmp_path, archive, "*", "/opt/")


def test_a_benign_context_keeps_files_modes_and_in_context_links(tmp_path: Path) -> None:
    members: list[tuple[tarfile.TarInfo, bytes | None]] = [
        (_member("app", tarfile.DIRTYPE), None),
        (_member("app/run.sh", mode=0o755), b"#!/bin/sh\necho hi\n"),
        (_member("app/conf", tarfile.DIRTYPE), None),
        (_member("app/conf/a.txt"), b"a\n"),
        (_member("app/current", tarfile.SYMTYPE, linkname="conf/a.txt"), None),
        (_member("app/again", tarfile.LNKTYPE, linkname="app/conf/a.txt"), None),
        (_member("app/dangling", tarfile.SYMTYPE, linkname="/usr/lib/whatever"), None),
    ]
    tree = copy_step(tmp_path, write_tar(tmp_path / "a.tar", members), "app", "/opt/app/")
    app = tree / "opt/app"
    assert (app / "run.sh").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert stat.S_IMODE((app / "run.sh").stat().st_mode) == 0o755
    assert os.readlink(app / "current") == "conf/a.txt"
    assert (app / "current").read_text() == "a\n"  # in-context: it resolves in the layer
    assert (app / "again").read_text() == "a\n"
    assert os.readlink(app / "dangling") == "/usr/lib/whatever"  # a name inside the sandbox
    assert {p.lstat().st_uid for p in app.rglob("*")} == {1000}


def test_removing_a_layer_never_follows_its_links(tmp_path: Path, host: Path) -> None:
    """The garbage collection's removal of a layer (and of a leftover that is itself a
    symlink) removes the links, never what they name."""
    before = tree_state(host)
    data_dir = tmp_path / "data"
    layers = template_layers.root(data_dir)
    tree = layers / ("a" * 64) / "tree"
    (tree / "opt").mkdir(parents=True)
    os.symlink(str(host), tree / "opt" / "s")
    os.symlink("../../../../host/secret", tree / "opt" / "f")
    os.symlink(str(host), layers / ".staging-planted")
    template_layers.remove(data_dir, "a" * 64)
    template_layers.remove(data_dir, ".staging-planted")
    assert not os.listdir(layers)
    assert tree_state(host) == before


@pytest.mark.parametrize(
    ("src", "expected"),
    [
        (".", {"app/run.sh", "app/conf/a.txt", "top.txt", ".hidden"}),
        ("./app/conf", {"a.txt"}),
        ("*/conf/*.txt", {"a.txt"}),
        ("ap?/run.sh", {"run.sh"}),
        ("[at]*", {"run.sh", "conf/a.txt", "top.txt"}),
        ("link/*", None),  # a glob never enters a symlink of the context
    ],
)
def test_globs_match_beneath_the_context_and_never_enter_a_link(
    tmp_path: Path, host: Path, src: str, expected: set[str] | None
) -> None:
    members: list[tuple[tarfile.TarInfo, bytes | None]] = [
        (_member("app", tarfile.DIRTYPE), None),
        (_member("app/run.sh"), b"run\n"),
        (_member("app/conf", tarfile.DIRTYPE), None),
        (_member("app/conf/a.txt"), b"a\n"),
        (_member("top.txt"), b"top\n"),
        (_member(".hidden"), b"h\n"),
        (_member("link", tarfile.SYMTYPE, linkname=str(host)), None),
    ]
    archive = write_tar(tmp_path / "a.tar", members)
    if expected is None:
        with pytest.raises(RuntimeFailure, match="matched no file"):
            copy_step(tmp_path, archive, src, "/opt/out/")
        return
    tree = copy_step(tmp_path, archive, src, "/opt/out/")
    out = tree / "opt/out"
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and not p.is_symlink()}
    assert files == expected
