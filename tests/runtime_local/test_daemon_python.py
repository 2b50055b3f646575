"""The daemon's own interpreter tree (shared/runtime/local/daemon_python.py): built from this
interpreter, it runs the daemon with the host's interpreter prefix, venv and checkout hidden, and
no file of it names them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shared.runtime.local import daemon_python
from shared.runtime.local.pod_commands import DAEMON_CODE, DAEMON_PY

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# Deepest first: hiding the checkout first would hide a venv inside it from the next mount.
HIDDEN = sorted({Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), REPO}, reverse=True)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> daemon_python.DaemonPython:
    return daemon_python.ensure(tmp_path_factory.mktemp("data"))


def test_no_file_of_the_tree_names_the_venv_or_the_checkout(
    daemon: daemon_python.DaemonPython,
) -> None:
    named = []
    for path in daemon.tree.rglob("*"):
        assert not path.is_symlink(), path  # the tree is bound into pods: nothing points out
        if path.name == "__pycache__" or path.suffix in {".pth", ".pyc"}:
            named.append(f"{path}: bytecode or a .pth")
        if path.is_file():
            data = path.read_bytes()
            named += [f"{path}: {h}" for h in map(str, HIDDEN) if h.encode() in data]
    assert not named, "\n".join(named[:20])
    assert daemon.executable == f"{DAEMON_PY}/bin/python{sys.version_info[0]}.{sys.version_info[1]}"


def test_every_runpath_is_relative_to_the_tree(daemon: daemon_python.DaemonPython) -> None:
    patchelf = daemon_python._patchelf()
    for path in daemon.tree.rglob("*.so*"):
        rpath = subprocess.run(
            [patchelf, "--print-rpath", str(path)], capture_output=True, text=True, check=True
        ).stdout
        assert not any(str(h) in rpath for h in HIDDEN), f"{path}: {rpath}"


# Root, in a private mount namespace: the interpreter's prefix, the venv and the checkout under
# empty tmpfs, the tree and a copy of the daemon's package where pods have them; then the daemon's
# whole import closure (what it loads to serve) and its view of itself.
_RUN = """set -e
tree=$1; code=$2; shift 2
mount -t tmpfs -o size=64k torpor-test {daemon_dir}
mkdir -p {py} {code}
mount --bind -o ro "$tree" {py}
mount --bind -o ro "$code" {code}
for hidden in "$@"; do mount -t tmpfs -o size=64k torpor-hidden "$hidden"; done
cd /
exec {executable} -I -c "$SCRIPT"
"""
_UNSHARE = ["unshare", "-m", "--propagation", "private", "sh", "-c"]
_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, %r)
    from services.envd.__main__ import load_closure
    load_closure()
    import ctypes, hashlib, json, ssl, sqlite3, zlib
    maps = open("/proc/self/maps").read()
    print(json.dumps({"prefix": sys.prefix, "path": sys.path, "maps": maps}))
    """
)


def test_the_daemon_loads_from_the_tree_alone(
    daemon: daemon_python.DaemonPython, tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (a private mount namespace)")
    code = tmp_path / "code"
    shutil.copytree(REPO / "services" / "envd", code / "services" / "envd")
    shutil.copy2(REPO / "services" / "__init__.py", code / "services" / "__init__.py")
    script = _RUN.format(
        daemon_dir=str(Path(DAEMON_PY).parent),
        py=DAEMON_PY,
        code=DAEMON_CODE,
        executable=daemon.executable,
    )
    done = subprocess.run(
        [*_UNSHARE, script, "sh", str(daemon.tree), str(code), *map(str, HIDDEN)],
        env={"PATH": os.environ["PATH"], "SCRIPT": _SCRIPT % DAEMON_CODE},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["prefix"] == DAEMON_PY
    assert all(p.startswith("/run/torpor-daemon/") for p in seen["path"]), seen["path"]
    leaked = [line for line in seen["maps"].splitlines() if any(str(h) in line for h in HIDDEN)]
    assert not leaked, leaked


def test_the_key_follows_the_installed_distributions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setattr(daemon_python, "_site_dirs", lambda: [site])
    before = daemon_python._key()
    assert daemon_python._key() == before  # stable
    (site / "extra-1.0.dist-info").mkdir()
    assert daemon_python._key() != before
