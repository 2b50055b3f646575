"""A pinned ``e2b`` SDK in its own virtualenv under ~/.cache/torpor, run as a subprocess: the
project's venv (which has a newer SDK) is never modified."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

CACHE = Path.home() / ".cache" / "torpor"


def pinned_sdk_python(version: str) -> Path:
    """The python of a venv holding ``e2b==version`` (created once); ``RuntimeError`` if it
    cannot be installed."""
    venv = CACHE / f"e2b-sdk-{version}"
    python = venv / "bin" / "python"
    probe = [
        str(python),
        "-c",
        f"import importlib.metadata as m; assert m.version('e2b') == '{version}'",
    ]
    if python.exists() and subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return python
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        msg = "uv is not installed (scripts/setup.sh puts it into .venv)"
        raise RuntimeError(msg)
    CACHE.mkdir(parents=True, exist_ok=True)
    steps = [
        [uv, "venv", "-q", "--allow-existing", "--python", sys.executable, str(venv)],
        [uv, "pip", "install", "-q", "--python", str(python), f"e2b=={version}"],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            msg = f"{' '.join(step[:3])} failed: {done.stderr.strip()[-300:]}"
            raise RuntimeError(msg)
    return python
