"""The image build's plan (Kubernetes): the images a step builds on, and every step's key and
settings decided before any runs, so the builder can start from the longest cached prefix."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import PurePosixPath

from services.builder.builds import State, step_key
from shared.models.template_records import BuildRecord, BuildSpec, Step
from shared.oci.images import Image
from shared.oci.registry import check_repository

FILE_STEPS = ("RUN", "COPY", "WORKDIR")


@dataclass(frozen=True)
class ImageRef:
    repository: str
    reference: str  # a tag or a digest

    @classmethod
    def parse(cls, value: str) -> ImageRef:
        if "@" in value:
            repo, _, ref = value.partition("@")
        else:
            head, _, last = value.rpartition("/")
            name, sep, tag = last.partition(":")
            repo, ref = (f"{head}/{name}" if head else name), (tag if sep else "latest")
        check_repository(repo)
        return cls(repo, ref)


@dataclass(frozen=True)
class Parent:
    """The image a step builds on: where it is and what it is."""

    repository: str
    digest: str
    image: Image


@dataclass(frozen=True)
class Planned:
    number: int
    step: Step
    key: str
    state: State  # what the step runs with (after its own effect for ENV, USER, WORKDIR)
    forced: bool


def plan(record: BuildRecord, spec: BuildSpec, parent: Parent, state: State) -> list[Planned]:
    """Every step's key (the owner, the key before it down to ``parent``'s digest, the step)
    and the settings it runs with."""
    key = step_key("oci", record.owner, parent.digest)
    forcing = spec.force
    planned = []
    for number, step in enumerate(spec.steps, 1):
        forcing = forcing or step.force
        step_id = step.model_dump(include={"type", "args", "files_hash"})
        key = step_key(
            key, step_id, record.build_id if forcing else None, state.user, state.workdir
        )
        state = replace(state, env=dict(state.env))
        if step.type == "ENV":
            pairs = step.args
            state.env.update(dict(zip(pairs[::2], pairs[1::2], strict=True)))
        elif step.type == "USER":
            state.user = step.args[0].split(":")[0]
        elif step.type == "WORKDIR":
            state.workdir = str(PurePosixPath(state.workdir) / step.args[0])
        planned.append(Planned(number, step, key, state, forcing))
    return planned


def label(entry: Planned, total: int) -> str:
    where = f"[{entry.number}/{total}] " if total else ""
    return f"{where}{entry.step.type} {' '.join(entry.step.args)}"[:500]


def cache_tag(key: str) -> str:
    return f"cache-{key[:64]}"
