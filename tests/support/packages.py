"""Packages made on the spot for template build contexts (nothing downloaded): a wheel that
``pip install --no-index`` takes, a .deb that ``dpkg -i`` takes. Used by tests/templates and
bench/template_bench.py."""

from __future__ import annotations

import io
import subprocess
import zipfile
from collections.abc import Mapping
from pathlib import Path


def write_wheel(path: Path, files: Mapping[str, str]) -> None:
    """A wheel (a zip) at ``path`` holding ``files`` (name -> text), in that order."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    path.write_bytes(buf.getvalue())


def build_deb(out: Path, root: Path, control: str, files: Mapping[str, str]) -> None:
    """A .deb at ``out``, built with dpkg-deb from ``root`` (a new folder): ``DEBIAN/control``
    and ``files`` (path below the root -> text)."""
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(control)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(root), str(out)],
        check=True,
        capture_output=True,
    )
