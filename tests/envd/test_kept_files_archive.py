"""``/kept-files`` on a real daemon: the export of /home/user and /workspace, the import into a
fresh daemon's, and hostile tars (each refused or neutralised, nothing written outside, a 4xx
JSON error). ``--kept-root`` points the daemon's two folders into a temporary directory."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import skip_or_fail
from tests.envd.conftest import TOKEN, Daemon, start_daemon, stop_daemon
from tests.support.tar_members import tar_bytes

AUTH = {"X-Access-Token": TOKEN}


def _daemon(base: Path) -> Daemon:
    kept = base / "kept"
    for top in ("home/user", "workspace"):
        (kept / top).mkdir(parents=True)
    (base / "outside").mkdir()
    return start_daemon(base, base / "envd.log", extra=("--kept-root", str(kept)))


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for every refused import: a refusal leaves imports open."""
    # In a folder of its own: the refusal tests watch the daemon root's parent for escapes, and
    # the worker's temp root beside it holds other tests' session stacks, which keep writing.
    d = _daemon(tmp_path_factory.mktemp("kept-refusing") / "daemon")
    yield d
    stop_daemon(d)


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    return tar_bytes(members)


def _file(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info, data


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


def _import(d: Daemon, body: bytes, limit: int = 1 << 20) -> httpx.Response:
    return httpx.post(
        f"{d.url}/kept-files", params={"limit": str(limit)}, content=body, headers=AUTH, timeout=30
    )


def _everything(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_export_then_import_into_a_fresh_daemon(tmp_path: Path) -> None:
    source = _daemon(tmp_path / "a")
    target = _daemon(tmp_path / "b")
    try:
        kept = tmp_path / "a" / "kept"
        (kept / "home/user/notes").mkdir()
        (kept / "home/user/notes/today.txt").write_text("kept across a pause")
        (kept / "home/user/run.sh").write_text("#!/bin/sh\necho hi\n")
        (kept / "home/user/run.sh").chmod(0o755)
        (kept / "workspace/data.bin").write_bytes(os.urandom(300_000))
        (kept / "home/user/rel").symlink_to("notes/today.txt")
        secret = tmp_path / "a" / "outside" / "secret"
        secret.write_text("not the sandbox's")
        (kept / "home/user/escape").symlink_to(secret)  # kept as a link, never followed
        assert httpx.get(f"{source.url}/kept-files", timeout=10).status_code == 401
        exported = httpx.get(f"{source.url}/kept-files", headers=AUTH, timeout=30)
        assert exported.status_code == 200, exported.text
        assert b"not the sandbox's" not in exported.content
        names = tarfile.open(fileobj=io.BytesIO(exported.content)).getnames()
        assert set(names) >= {"home/user/notes/today.txt", "workspace/data.bin", "home/user/rel"}

        # A link pointing outside is refused on import: export a tree without it.
        (kept / "home/user/escape").unlink()
        exported = httpx.get(f"{source.url}/kept-files", headers=AUTH, timeout=30)
        assert _import(target, exported.content, limit=10 << 20).status_code == 200
        back = tmp_path / "b" / "kept"
        assert (back / "home/user/notes/today.txt").read_text() == "kept across a pause"
        assert (back / "workspace/data.bin").read_bytes() == (
            kept / "workspace/data.bin"
        ).read_bytes()
        assert os.readlink(back / "home/user/rel") == "notes/today.txt"
        assert (back / "home/user/run.sh").stat().st_mode & 0o100

        again = _import(target, exported.content, limit=10 << 20)
        assert again.status_code == 409 and "fresh pod" in again.json()["message"]
    finally:
        stop_daemon(source)
        stop_daemon(target)


@pytest.mark.parametrize(
    ("members", "status", "words"),
    [
        pytest.param([_file("home/user/../../../outside/pwn")], 400, "outside", id="dotdot"),
        pytest.param([_file("/etc/torpor-pwn")], 400, "not under", id="absolute"),
        pytest.param([_file("etc/torpor-pwn")], 400, "not under", id="other-top"),
        pytest.param(
            [_link("home/user/esc", "/"), _file("home/user/esc/outside/pwn")],
            400,
            "refused",
            id="symlink-absolute-then-write",
        ),
        pytest.param(
            [_link("home/user/esc", "../../outside"), _file("home/user/esc/pwn")],
            400,
            "refused",
            id="symlink-relative-then-write",
        ),
        pytest.param(
            [_link("home/user/esc", "../workspace")], 400, "refused", id="symlink-to-the-other-top"
        ),
        pytest.param(
            [_file("home/user/a"), _link("home/user/h", "home/user/a", tarfile.LNKTYPE)],
            400,
            "hard links",
            id="hardlink",
        ),
        pytest.param([_link("home/user/dev", "", tarfile.CHRTYPE)], 400, "refused", id="device"),
        pytest.param([_link("home/user/fifo", "", tarfile.FIFOTYPE)], 400, "refused", id="fifo"),
        pytest.param([_file("home/user/big", b"x" * 5000)], 413, "limit", id="over-limit"),
    ],
)
def test_a_hostile_tar_is_refused_and_writes_nothing_outside(
    refusing: Daemon, members: list[tuple[tarfile.TarInfo, bytes | None]], status: int, words: str
) -> None:
    outside = refusing.root / "outside"
    before = _everything(refusing.root.parent)
    answer = _import(refusing, _tar(*members), limit=4096)
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert words in answer.json()["message"]
    assert list(outside.iterdir()) == []
    assert not Path("/etc/torpor-pwn").exists()
    new = _everything(refusing.root.parent) - before
    outside_kept = [
        n for n in new if not (n.startswith(f"{refusing.root.name}/kept/") or n.endswith(".log"))
    ]
    assert outside_kept == []


def test_a_header_claiming_a_huge_size_is_refused_before_extraction(refusing: Daemon) -> None:
    info = tarfile.TarInfo("home/user/bomb")
    info.size = 10 * 1024**3  # a tar bomb's header: 10 GiB, the data never sent
    header = info.tobuf(format=tarfile.PAX_FORMAT)
    answer = _import(refusing, header + b"\0" * 4096, limit=1 << 20)
    assert answer.status_code == 413, answer.text
    assert not (refusing.root / "kept/home/user/bomb").exists()


def test_a_body_over_the_limit_is_cut_off(refusing: Daemon) -> None:
    answer = _import(refusing, b"\0" * (3 << 20), limit=1 << 20)
    assert answer.status_code == 413, answer.text


def test_a_pax_name_with_a_nul_byte_is_refused(refusing: Daemon) -> None:
    info = tarfile.TarInfo("home/user/plain")
    info.pax_headers = {"path": "home/user/a\x00/../../../outside/pwn"}
    answer = _import(refusing, _tar((info, b"x")))
    assert answer.status_code == 400, answer.text
    assert "NUL" in answer.json()["message"]
    assert list((refusing.root / "outside").iterdir()) == []


def test_a_link_already_in_the_home_is_not_written_through(refusing: Daemon) -> None:
    """A sandbox's own link (left in its folder) to outside: an import never follows it."""
    link = refusing.root / "kept/home/user/planted"
    link.symlink_to(refusing.root / "outside")
    try:
        answer = _import(refusing, _tar(_file("home/user/planted/pwn")))
        assert answer.status_code == 400, answer.text
        assert list((refusing.root / "outside").iterdir()) == []
    finally:
        link.unlink()


@pytest.mark.parametrize("bad", ["", "-1", "0", "1e9", "99999999999999999", "--limit", "1\x00"])
def test_a_bad_limit_is_refused(refusing: Daemon, bad: str) -> None:
    answer = httpx.post(
        f"{refusing.url}/kept-files", params={"limit": bad}, content=b"", headers=AUTH
    )
    assert answer.status_code == 400
    assert "limit" in answer.json()["message"]


def test_neutralised_names_and_modes(tmp_path: Path) -> None:
    """Option-looking and NUL-truncated names are plain files in the home; setuid/setgid and
    group/other write bits are dropped. No tar binary ever sees a name."""
    d = _daemon(tmp_path)
    try:
        ustar = tarfile.TarInfo("home/user/nul\x00/../../../outside/pwn")  # ustar cuts at NUL
        body = _tar(
            _file("home/user/--checkpoint-action=exec=sh", b"echo pwned > /tmp/torpor-pwn"),
            _file("workspace/suid", b"#!/bin/sh\n", mode=0o6777),
            (ustar, b"x"),
        )
        # Written as a ustar header, the name is cut at the NUL by every reader.
        answer = _import(d, body)
        assert answer.status_code == 200, answer.text
        kept = tmp_path / "kept"
        assert (kept / "home/user/--checkpoint-action=exec=sh").read_bytes().startswith(b"echo")
        mode = stat.S_IMODE((kept / "workspace/suid").stat().st_mode)
        assert mode & (stat.S_ISUID | stat.S_ISGID | stat.S_IWGRP | stat.S_IWOTH) == 0
        assert not Path("/tmp/torpor-pwn").exists()
        assert list((tmp_path / "outside").iterdir()) == []
    finally:
        stop_daemon(d)


def test_a_started_process_closes_imports(tmp_path: Path) -> None:
    d = _daemon(tmp_path)
    try:
        httpx.post(
            f"{d.url}/process.Process/Start",
            content=b"{}",
            headers={**AUTH, "Content-Type": "application/connect+json"},
        )
        answer = _import(d, _tar(_file("home/user/late")))
        assert answer.status_code == 409
        assert "process was started" in answer.json()["message"]
        assert not (tmp_path / "kept/home/user/late").exists()
    finally:
        stop_daemon(d)


SYSTEM_PYTHON = Path("/usr/bin/python3")  # Debian bookworm's 3.11.2: the images' python
CHILD = Path(__file__).resolve().parents[2] / "services/envd/kept_child.py"


def _system_python_without_filters() -> str:
    import subprocess

    if not SYSTEM_PYTHON.exists():
        skip_or_fail(f"{SYSTEM_PYTHON} is missing (the sandbox images' python)")
    probe = "import tarfile; print(hasattr(tarfile, 'FilterError'))"
    out = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-S", "-c", probe], capture_output=True, text=True, check=True
    )
    if out.stdout.strip() != "False":
        skip_or_fail(f"{SYSTEM_PYTHON} has tarfile's extraction filters: nothing to prove")
    return str(SYSTEM_PYTHON)


def test_the_child_imports_on_a_python_without_tarfile_filters(tmp_path: Path) -> None:
    """The sandbox images run the child on Debian's python 3.11.2, older than tarfile's
    ``filter=`` (3.11.4): an import there was a 500 on every real container. The child runs on
    it as it is: a tree comes back (file, folder, link, modes neutralised), and a link is
    still never written through."""
    import json
    import subprocess

    python = _system_python_without_filters()
    kept = tmp_path / "kept"
    for top in ("home/user", "workspace"):
        (kept / top).mkdir(parents=True)
    (tmp_path / "outside").mkdir()

    def run(body: bytes) -> dict[str, object]:
        done = subprocess.run(
            [python, "-I", "-S", str(CHILD), "import", str(kept), str(1 << 20), "-", "-"],
            input=body,
            check=False,
            capture_output=True,
            timeout=30,
        )
        assert done.stderr == b"", done.stderr
        answer: dict[str, object] = json.loads(done.stdout.decode().splitlines()[-1])
        return answer

    refused = run(_tar(_link("home/user/esc", "../../outside"), _file("home/user/esc/pwn")))
    assert refused["ok"] is False and refused["status"] == 400, refused
    escape = run(_tar(_file("home/user/../../outside/pwn")))
    assert escape["ok"] is False and escape["status"] == 400, escape
    assert list((tmp_path / "outside").iterdir()) == []

    folder = tarfile.TarInfo("home/user/notes")
    folder.type, folder.mode = tarfile.DIRTYPE, 0o2777
    answer = run(
        _tar(
            (folder, None),
            _file("home/user/notes/today.txt", b"kept", mode=0o4755),
            _link("home/user/rel", "notes/today.txt"),
            _file("workspace/deep/f.bin", bytes(range(256))),
        )
    )
    assert answer == {"ok": True, "files": 4, "bytes": 260}, answer
    assert (kept / "home/user/notes/today.txt").read_bytes() == b"kept"
    assert (kept / "workspace/deep/f.bin").read_bytes() == bytes(range(256))
    assert os.readlink(kept / "home/user/rel") == "notes/today.txt"
    assert stat.S_IMODE((kept / "home/user/notes/today.txt").stat().st_mode) == 0o755
    assert stat.S_IMODE((kept / "home/user/notes").stat().st_mode) == 0o755
