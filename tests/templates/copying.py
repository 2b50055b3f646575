"""One build step's COPY into a fresh layer under a test's folder, as the builder runs it for the
default user (1000, in /home/user): the template tests' way to call ``template_layers.copy_in``."""

from __future__ import annotations

import shutil
from pathlib import Path

from shared.runtime.local import template_layers


def copy_step(
    tmp_path: Path,
    archive: Path,
    src: str,
    dest: str,
    lowers: list[Path] | None = None,
    limits: template_layers.ContextLimits | None = None,
) -> Path:
    """COPY ``src`` of ``archive`` to ``dest`` in ``tmp_path/layer`` (returned), over ``lowers``
    and ``tmp_path/lower`` (made empty unless the test filled it)."""
    tree = tmp_path / "layer"
    tree.mkdir(parents=True, exist_ok=True)
    scratch = tmp_path / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)  # one build step's scratch per call
    scratch.mkdir(parents=True)
    lower = tmp_path / "lower"
    lower.mkdir(parents=True, exist_ok=True)
    template_layers.copy_in(
        archive,
        tree,
        src=src,
        dest=dest,
        workdir="/home/user",
        owner=1000,
        mode=None,
        lowers=[*(lowers or []), lower],
        scratch=scratch,
        limits=limits,
    )
    return tree
