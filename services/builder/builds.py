"""What both builders (the local runtime's ``.building`` and Kubernetes' ``.oci_build``) share:
the ports they use, a build's settings so far, a failed step, the build log, step keys and the
artifact a ready build leaves."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from shared.models.snapshots import ProcessConfig
from shared.models.template_records import (
    MAX_LOG_CHARS,
    TEMPLATE_FILES_DIR,
    Artifact,
    BuildRecord,
    BuildSpec,
    LogLine,
    Step,
    TemplateRecord,
    blob_path,
)
from shared.ports.runtime import Runtime
from shared.ports.workloads import Endpoint
from shared.runtime.local import template_layers

DEFAULT_WORKDIR = "/home/user"
FLUSH_SECONDS = 0.5
TAIL_LINES = 30
BUILD_LABEL = "torpor.dev/build"
UNSUPPORTED_ON_KUBERNETES = (
    "template builds on Kubernetes push an image to a registry, and this deployment has none "
    "configured (TORPOR_BUILDER_REGISTRY)"
)


class Store(Protocol):
    async def get_build(self, build_id: str) -> BuildRecord | None: ...
    async def update_build(
        self, build_id: str, mutate: Callable[[BuildRecord], BuildRecord]
    ) -> BuildRecord: ...
    async def get_template(self, template_id: str) -> TemplateRecord | None: ...
    async def update_template(
        self, template_id: str, mutate: Callable[[TemplateRecord], TemplateRecord]
    ) -> TemplateRecord: ...


class Commands(Protocol):
    async def run(
        self,
        endpoint: Endpoint,
        config: ProcessConfig,
        *,
        user: str,
        access_token: str | None,
        on_output: Callable[[str], Awaitable[None]],
        timeout: float,
    ) -> int: ...


class LayerExport(Protocol):
    async def export_files(self, name: str, dest: Path) -> None: ...


class BuildRuntime(Runtime, LayerExport, Protocol):
    """The local runtime: the runtime port plus copying a stopped workload's files out."""


@dataclass(frozen=True)
class Limits:
    memory: str = "2Gi"
    cpu: str = "1"
    disk: str = "4Gi"


class StepFailed(Exception):
    def __init__(self, step: int, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.message = message
        self.exit_code = exit_code


@dataclass
class State:
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = DEFAULT_WORKDIR
    user: str = "user"


class BuildLog:
    """Log lines of one build, written to its record in batches (one CAS per flush)."""

    def __init__(self, store: Store, build_id: str) -> None:
        self._store = store
        self._build_id = build_id
        self._pending: list[LogLine] = []
        self._last = time.monotonic()
        self.tail: list[LogLine] = []

    async def line(self, message: str, *, level: str = "info", step: int | None = None) -> None:
        entry = LogLine(
            timestamp=datetime.now(UTC),
            level=level,
            message=message[:MAX_LOG_CHARS],
            step=str(step) if step is not None else None,
        )
        self._pending.append(entry)
        self.tail = [*self.tail[-(TAIL_LINES - 1) :], entry]
        if time.monotonic() - self._last >= FLUSH_SECONDS:
            await self.flush()

    async def flush(self) -> None:
        self._last = time.monotonic()
        if not self._pending:
            return
        lines, self._pending = self._pending, []
        await self._store.update_build(self._build_id, lambda r: r.with_logs(lines))


def step_key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def build_artifact(
    spec: BuildSpec,
    state: State,
    base: Artifact | None,
    *,
    layers: list[str] | None = None,
    image: str | None = None,
) -> Artifact:
    """What a ready build leaves (both runtimes): its layers or image, the settings its steps
    left, and the start and ready commands (the build's own, else its base template's)."""
    return Artifact(
        layers=layers or [],
        image=image,
        env=state.env,
        workdir=state.workdir,
        user=state.user if state.user in ("root", "user") else "user",
        start_cmd=spec.start_cmd
        if spec.start_cmd is not None
        else (base.start_cmd if base else None),
        ready_cmd=spec.ready_cmd
        if spec.ready_cmd is not None
        else (base.ready_cmd if base else None),
    )


@dataclass(frozen=True)
class CopyArgs:
    """A COPY step's uploaded archive and where and how its files land (``COPY src dest [user]
    [mode]``): the same for both builders."""

    archive: Path
    src: str
    dest: str
    owner: int
    mode: int | None


def copy_args(data_dir: Path, owner: str, step: Step, state: State, number: int) -> CopyArgs:
    assert step.files_hash is not None
    archive = blob_path(data_dir / TEMPLATE_FILES_DIR, owner, step.files_hash)
    if not archive.is_file():
        raise StepFailed(number, f"COPY failed: the files of {step.args[0]!r} were not uploaded")
    args = [*step.args, "", ""]
    user = (args[2] or state.user).split(":")[0]
    try:
        mode = int(args[3], 8) if args[3] else None
    except ValueError as e:
        raise StepFailed(number, f"COPY failed: {e}") from e
    ids = template_layers.USER_IDS.get(user, 1000)
    return CopyArgs(archive, step.args[0], step.args[1], ids, mode)
