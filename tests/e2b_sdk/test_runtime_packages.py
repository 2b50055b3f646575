"""Packages at run time, as E2B users install them: ``pip install`` (sandbox-base: Debian's python
without a PEP 668 refusal; code-interpreter-v1: its venv) and ``sudo apt-get install``, from a
package index the test serves inside the sandbox's own network namespace (never the outside
network): a wheel and a .deb made here, an index on the sandbox's loopback."""

from __future__ import annotations

import base64
import hashlib
import io
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox
from e2b_code_interpreter import Sandbox as CodeSandbox

from tests.conftest import skip_or_fail
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

INDEX_PORT = 18765


def _wheel() -> bytes:
    """torpor-probe 1.0, pure python: ``import torpor_probe; torpor_probe.VALUE == 7``."""
    files = {
        "torpor_probe/__init__.py": b"VALUE = 7\n",
        "torpor_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: torpor-probe\nVersion: 1.0\n",
        "torpor_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: torpor-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("torpor_probe-1.0.dist-info/RECORD,,")
    files["torpor_probe-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return out.getvalue()


def _serve_index(s: Sandbox) -> str:
    """A PyPI "simple" index (a folder listing is one) on the sandbox's own loopback."""
    s.files.write("/tmp/index/torpor-probe/torpor_probe-1.0-py3-none-any.whl", _wheel())
    s.commands.run(
        f"python3 -m http.server {INDEX_PORT} --bind 127.0.0.1 --directory /tmp/index",
        background=True,
    )
    s.commands.run(
        f"for i in $(seq 50); do curl -sf http://127.0.0.1:{INDEX_PORT}/ >/dev/null && exit 0; "
        "sleep 0.2; done; exit 1"
    )
    return f"http://127.0.0.1:{INDEX_PORT}/"


@pytest.fixture(scope="module")
def base(up: Stack) -> Iterator[Sandbox]:
    # ``torpor up`` serves the packaged sandbox-base (the shared ``stack`` overrides it).
    s = Sandbox.create(template="base", timeout=300, **up.sdk_opts())
    yield s
    s.kill()


def test_pip_install_in_sandbox_base(base: Sandbox) -> None:
    index = _serve_index(base)
    done = base.commands.run(f"pip install --index-url {index} torpor-probe 2>&1", timeout=120)
    assert "Successfully installed torpor-probe-1.0" in done.stdout, done.stdout
    assert "externally-managed" not in done.stdout
    check = base.commands.run("python3 -c 'import torpor_probe; print(torpor_probe.VALUE)'")
    assert check.stdout.strip() == "7"
    # As root (sudo keeps no PIP_* variable; root's pip installs system-wide with the flag).
    root = base.commands.run(
        f"pip install --break-system-packages --index-url {index} torpor-probe 2>&1",
        user="root",
        timeout=120,
    )
    assert "torpor-probe" in root.stdout, root.stdout


def test_sudo_apt_get_install(base: Sandbox, tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "DEBIAN").mkdir(parents=True)
    (package / "usr/share/torpor-probe").mkdir(parents=True)
    (package / "usr/share/torpor-probe/ok").write_text("installed\n")
    (package / "DEBIAN/control").write_text(
        "Package: torpor-probe\nVersion: 1.0\nArchitecture: all\n"
        "Maintainer: torpor tests <tests@localhost>\nDescription: a test package\n"
    )
    deb = tmp_path / "torpor-probe.deb"
    try:
        subprocess.run(
            ["dpkg-deb", "--build", str(package), str(deb)], check=True, capture_output=True
        )
    except FileNotFoundError:
        skip_or_fail("dpkg-deb is missing (Debian's dpkg)")
    base.files.write("/tmp/torpor-probe.deb", deb.read_bytes())
    done = base.commands.run("sudo apt-get install -y /tmp/torpor-probe.deb 2>&1", timeout=180)
    assert done.exit_code == 0, done.stdout
    assert base.files.read("/usr/share/torpor-probe/ok") == "installed\n"
    listed = base.commands.run("dpkg-query -W -f='${Status}' torpor-probe")
    assert listed.stdout == "install ok installed"


def test_pip_install_in_code_interpreter(stack: Stack) -> None:
    s = CodeSandbox.create(timeout=300, **stack.sdk_opts())
    try:
        index = _serve_index(s)
        done = s.commands.run(f"pip install --index-url {index} torpor-probe 2>&1", timeout=120)
        assert "Successfully installed torpor-probe-1.0" in done.stdout, done.stdout
        assert s.run_code("import torpor_probe; torpor_probe.VALUE").text == "7"
        # From inside the kernel too (E2B users run `!pip install` in a cell).
        cell = s.run_code(f"!pip install -q --force-reinstall --index-url {index} torpor-probe")
        assert cell.error is None
    finally:
        s.kill()
