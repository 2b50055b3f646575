"""The beneath-the-root file primitive (shared/runtime/local/beneath.py), fast tier: no path
given to a ``Dir`` leaves it (``..``, absolute, a symlink anywhere on the way, the last name
included), symlinks are made, chowned and removed as links, and ``copy_tree`` copies a hostile
tree (links to host folders and files, hard links, whiteouts) without touching anything outside
its destination. Host sentinels are checked for content, owner, mode and existence."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from shared.runtime.local import beneath
from tests.support.host_state import tree_state

pytestmark = pytest.mark.unit


def _sentinels(tmp_path: Path) -> tuple[Path, Path]:
    host = tmp_path / "host"
    host.mkdir(mode=0o755)
    (host / "secret").write_text("host secret")
    os.chmod(host / "secret", 0o600)
    return host, host / "secret"


@pytest.fixture
def root(tmp_path: Path) -> beneath.Dir:
    (tmp_path / "root").mkdir()
    d = beneath.Dir.open(tmp_path / "root")
    yield d  # type: ignore[misc]
    d.close()


@pytest.mark.parametrize("path", ["../host/secret", "/etc/passwd", "a/../../host/secret", "x\0y"])
def test_a_path_out_of_the_root_is_refused(tmp_path: Path, root: beneath.Dir, path: str) -> None:
    _sentinels(tmp_path)
    with pytest.raises(OSError):  # EXDEV or EINVAL
        root.open_file(path, os.O_RDONLY)
    with pytest.raises(OSError):
        root.mkdir(path)


@pytest.mark.parametrize("target", ["absolute", "relative"])
def test_no_operation_goes_through_a_symlink(
    tmp_path: Path, root: beneath.Dir, target: str
) -> None:
    host, secret = _sentinels(tmp_path)
    before = tree_state(host)
    link = str(host) if target == "absolute" else "../host"
    os.symlink(link, tmp_path / "root" / "s")  # a folder link
    os.symlink(str(secret) if target == "absolute" else "../host/secret", tmp_path / "root" / "f")
    for attempt in (
        lambda: root.open_file("s/secret", os.O_RDONLY),
        lambda: root.open_file("f", os.O_RDONLY),
        lambda: root.open_file("s/new", os.O_WRONLY | os.O_CREAT, 0o644),
        lambda: root.mkdir("s/new"),
        lambda: root.makedirs("s/new/deeper"),
        lambda: root.symlink("/x", "s/new"),
        lambda: root.chown("s/secret", 1234, 1234),
        lambda: root.chmod("s/secret", 0o777),
        lambda: root.unlink("s/secret"),
        lambda: root.remove("s/secret"),
        lambda: root.dir("s"),
        lambda: root.link("s/secret", "hard"),
    ):
        with pytest.raises(OSError):  # ELOOP or ENOTDIR
            attempt()
    # On the link itself: it is the link that changes, never its target.
    root.chown("s", 4321, 4321)
    root.chmod("f", 0o777)
    root.remove("s")
    root.unlink("f")
    assert not (tmp_path / "root" / "s").exists()
    assert tree_state(host) == before


def test_makedirs_and_files_beneath(root: beneath.Dir, tmp_path: Path) -> None:
    assert [str(p) for p in root.makedirs("a/b/c", 0o750)] == ["a", "a/b", "a/b/c"]
    fd = root.open_file("a/b/c/f", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    os.write(fd, b"x")
    os.close(fd)
    root.symlink("/etc/shadow", "a/l")
    assert root.readlink("a/l") == "/etc/shadow"
    root.link("a/b/c/f", "a/h")
    assert (tmp_path / "root/a/h").stat().st_ino == (tmp_path / "root/a/b/c/f").stat().st_ino
    root.remove("a")
    assert not (tmp_path / "root/a").exists()


def _hostile_tree(src: Path, host: Path) -> None:
    (src / "d" / "e").mkdir(parents=True)
    (src / "d" / "file").write_text("data")
    os.chmod(src / "d" / "file", 0o4755)
    os.link(src / "d" / "file", src / "d" / "e" / "hard")
    os.symlink(str(host), src / "d" / "to_host_dir")
    os.symlink(str(host / "secret"), src / "d" / "to_host_file")
    os.symlink("../../../host", src / "d" / "e" / "up")
    os.mknod(src / "wh", stat.S_IFCHR | 0o000, 0)  # an overlayfs whiteout
    os.setxattr(src / "d", "trusted.overlay.opaque", b"y")
    with open(src / "sparse", "wb") as f:
        f.truncate(1 << 30)


def test_copy_tree_copies_links_as_links_and_touches_nothing_outside(tmp_path: Path) -> None:
    host, _ = _sentinels(tmp_path)
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    _hostile_tree(src, host)
    before = tree_state(host)
    with beneath.Dir.open(src) as s, beneath.Dir.open(dst) as d:
        n = beneath.copy_tree(s, d, beneath.CopyRules(ids=lambda v: v + 100_000))
    assert n == 7
    assert (dst / "d/file").read_text() == "data"
    assert stat.S_IMODE((dst / "d/file").stat().st_mode) == 0o4755
    assert (dst / "d/e/hard").stat().st_ino == (dst / "d/file").stat().st_ino
    assert os.readlink(dst / "d/to_host_dir") == str(host)
    assert os.readlink(dst / "d/e/up") == "../../../host"
    assert (dst / "d/to_host_file").lstat().st_uid == 100_000
    assert (dst / "d").stat().st_uid == 100_000
    assert stat.S_ISCHR((dst / "wh").lstat().st_mode)
    assert (dst / "wh").lstat().st_rdev == 0
    assert os.getxattr(dst / "d", "trusted.overlay.opaque") == b"y"
    assert (dst / "sparse").stat().st_size == 1 << 30
    assert (dst / "sparse").stat().st_blocks == 0  # holes stay holes
    assert tree_state(host) == before


def test_a_merge_replaces_a_planted_symlink_instead_of_writing_through_it(tmp_path: Path) -> None:
    host, secret = _sentinels(tmp_path)
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "s").mkdir(parents=True)
    (src / "s" / "secret").write_text("tenant")
    (src / "f").write_text("tenant")
    dst.mkdir()
    os.symlink(str(host), dst / "s")  # planted by an earlier match or step
    os.symlink(str(secret), dst / "f")
    before = tree_state(host)
    rules = beneath.CopyRules(ids=lambda _: 1000, merge=True, root_meta=False, strip_setid=True)
    with beneath.Dir.open(src) as s, beneath.Dir.open(dst) as d:
        beneath.copy_tree(s, d, rules)
    assert (dst / "s").is_dir() and not (dst / "s").is_symlink()
    assert (dst / "s/secret").read_text() == "tenant"
    assert not (dst / "f").is_symlink()
    assert tree_state(host) == before


def test_without_merge_an_existing_entry_is_an_error(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "f").write_text("a")
    os.symlink("/etc/passwd", dst / "f")
    with beneath.Dir.open(src) as s, beneath.Dir.open(dst) as d, pytest.raises(FileExistsError):
        beneath.copy_tree(s, d)
    assert os.readlink(dst / "f") == "/etc/passwd"


def test_refused_specials_and_stripped_setid(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "f").write_text("a")
    os.chmod(src / "f", 0o6755)
    with beneath.Dir.open(src) as s, beneath.Dir.open(dst) as d:
        beneath.copy_tree(s, d, beneath.CopyRules(strip_setid=True, special="refuse"))
    assert stat.S_IMODE((dst / "f").stat().st_mode) == 0o755
    os.mkfifo(src / "p")
    (dst / "f").unlink()
    with (
        beneath.Dir.open(src) as s,
        beneath.Dir.open(dst) as d,
        pytest.raises(PermissionError, match="device, FIFO"),
    ):
        beneath.copy_tree(s, d, beneath.CopyRules(special="refuse"))
    os.unlink(src / "p")
    os.mknod(src / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a real device: never
    (dst / "f").unlink()
    with (
        beneath.Dir.open(src) as s,
        beneath.Dir.open(dst) as d,
        pytest.raises(PermissionError),
    ):
        beneath.copy_tree(s, d)
    assert not (dst / "null").exists()


def test_chown_tree_never_follows_a_symlink(tmp_path: Path) -> None:
    host, _ = _sentinels(tmp_path)
    tree = tmp_path / "tree"
    (tree / "a").mkdir(parents=True)
    os.symlink(str(host), tree / "a" / "s")
    (tree / "a" / "f").write_text("x")
    before = tree_state(host)
    with beneath.Dir.open(tree) as d:
        changed = beneath.chown_tree(d, lambda st: (st.st_uid + 7, st.st_gid + 7))
    assert changed == 4  # tree, a, s (the link), f
    assert (tree / "a" / "s").lstat().st_uid == 7
    assert tree_state(host) == before


def test_copy_tree_across_filesystems(tmp_path: Path) -> None:
    """``copy_file_range`` refuses some pairs of filesystems (EXDEV): the copy reads and writes."""
    shm = Path("/dev/shm")
    src = Path(os.path.join(shm if shm.is_dir() else tmp_path, f"beneath-{os.getpid()}"))
    src.mkdir()
    try:
        (src / "f").write_bytes(b"x" * 300_000)
        (tmp_path / "dst").mkdir()
        with beneath.Dir.open(src) as s, beneath.Dir.open(tmp_path / "dst") as d:
            beneath.copy_tree(s, d)
        assert (tmp_path / "dst" / "f").read_bytes() == b"x" * 300_000
    finally:
        (src / "f").unlink(missing_ok=True)
        src.rmdir()
