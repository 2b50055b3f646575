"""Render torpor's kustomize overlays with a real kustomize.

Order: ``$TORPOR_KUSTOMIZE``, the binary ``deploy/tools/install-kustomize.sh`` put in
``~/.cache/torpor/bin``, ``kustomize`` on PATH, ``kubectl kustomize``; on CI, when none exists,
the install script is run (Go module proxy).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "deploy" / "tools" / "install-kustomize.sh"
OVERLAYS = {
    "dev": REPO / "deploy" / "kustomize" / "overlays" / "dev",
    "production": REPO / "deploy" / "kustomize" / "overlays" / "production",
    "shared-storage": REPO / "tests" / "deploy" / "overlays" / "shared-storage",
}
VERSION = "v5.5.0"


class KustomizeMissing(Exception):
    pass


def _cached() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "torpor" / "bin" / f"kustomize-{VERSION}"


@functools.cache
def command(*, install: bool) -> tuple[str, ...]:
    if explicit := os.environ.get("TORPOR_KUSTOMIZE"):
        return (explicit, "build")
    if os.access(_cached(), os.X_OK):
        return (str(_cached()), "build")
    if found := shutil.which("kustomize"):
        return (found, "build")
    if found := shutil.which("kubectl"):
        return (found, "kustomize")
    if not install:
        msg = f"no kustomize: run {INSTALL.relative_to(REPO)} (or install kubectl)"
        raise KustomizeMissing(msg)
    done = subprocess.run(
        ["bash", str(INSTALL)], capture_output=True, text=True, timeout=1800, check=False
    )
    if done.returncode != 0:
        raise KustomizeMissing(f"{INSTALL.name} failed: {done.stderr[-2000:]}")
    return (done.stdout.strip().splitlines()[-1], "build")


def render(overlay: str, *, install: bool) -> list[dict[str, Any]]:
    argv = [*command(install=install), str(OVERLAYS[overlay])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise AssertionError(f"kustomize failed on {overlay}: {done.stderr}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]
