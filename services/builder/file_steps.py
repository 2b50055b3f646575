"""The local builder's steps without a pod: COPY unpacks the uploaded archive into a new layer
(``template_layers.copy_in``), WORKDIR makes its folder (a tiny layer)."""

from __future__ import annotations

import tempfile
from pathlib import Path, PurePosixPath

from services.builder.builds import State, StepFailed, copy_args
from shared.errors import TorporError
from shared.models.template_records import BuildRecord, Step
from shared.runtime.local import template_layers


def lowers(data_dir: Path, rootfs: Path, layers: list[str]) -> list[Path]:
    """The layers so far, top first, over the rootfs."""
    trees = [template_layers.tree(data_dir, k) for k in reversed(layers)]
    return [*trees, rootfs]


def file_step(
    data_dir: Path,
    rootfs: Path,
    record: BuildRecord,
    *,
    step: Step,
    number: int,
    key: str,
    layers: list[str],
    state: State,
) -> None:
    folder = template_layers.staging(data_dir)
    tree = folder / "tree"
    try:
        if step.type == "WORKDIR":
            template_layers.make_parents(
                tree, PurePosixPath(state.workdir), lowers(data_dir, rootfs, layers), owner=0
            )
        else:
            _copy(
                data_dir,
                rootfs,
                record,
                step=step,
                number=number,
                tree=tree,
                layers=layers,
                state=state,
            )
        template_layers.commit(data_dir, folder, key)
    except TorporError as e:
        template_layers.discard(folder)
        raise StepFailed(number, f"{step.type} failed: {e}") from e
    except BaseException:
        template_layers.discard(folder)
        raise


def _copy(
    data_dir: Path,
    rootfs: Path,
    record: BuildRecord,
    *,
    step: Step,
    number: int,
    tree: Path,
    layers: list[str],
    state: State,
) -> None:
    copy = copy_args(data_dir, record.owner, step, state, number)
    with tempfile.TemporaryDirectory(dir=template_layers.root(data_dir)) as scratch:
        template_layers.copy_in(
            copy.archive,
            tree,
            src=copy.src,
            dest=copy.dest,
            workdir=state.workdir,
            owner=copy.owner,
            mode=copy.mode,
            lowers=lowers(data_dir, rootfs, layers),
            scratch=Path(scratch),
        )
