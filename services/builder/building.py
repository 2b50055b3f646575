"""One build: its steps in order on top of its base, each cached by content, the result a ready
template of the local runtime (read-only layers + a template file named by the build id).

- RUN runs in a build pod: a workload of the local runtime like any sandbox (its own user
  namespace and id range, cgroup limits, network namespace with the builder's policy, no host
  folder), on the layers so far; the pod's writable layer, exported with the sandbox's own ids,
  is the step's layer. One pod per RUN step, deleted after it.
- COPY unpacks the uploaded archive into a new layer (``template_layers.copy_in``), no pod.
- WORKDIR makes its folder (a tiny layer); ENV and USER only change what later steps and the
  template's sandboxes get.

A step's key is the sha256 of the key before it (which starts from the owner and the base)
and the step itself (the copied files' hash included), so a rebuild reuses every layer up to
the first changed step. ``force`` (E2B's ``skip_cache``) rebuilds that step and every later
one. A failing step ends the build: its exit code and the tail of its log go into the record;
the template's tags move only when a build is ready, so no half-built template is ever used.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import secrets
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Protocol

import structlog
import yaml

from shared.errors import EnvdError, EnvdUnavailable, TorporError
from shared.models.network import public_only
from shared.models.snapshots import ProcessConfig
from shared.models.template_records import (
    BUILT_TEMPLATES_DIR,
    MAX_LOG_CHARS,
    TEMPLATE_FILES_DIR,
    Artifact,
    BuildRecord,
    BuildSpec,
    BuildStatus,
    FailureReason,
    LogLine,
    Step,
    TemplateRecord,
    blob_path,
)
from shared.ports.runtime import Runtime
from shared.ports.workloads import Endpoint, WorkloadSpec
from shared.runtime.local import template_layers
from shared.runtime.local.rootfs import MARKER

log = structlog.get_logger()

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


def _key(*parts: object) -> str:
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


async def run_step(
    commands: Commands,
    endpoint: Endpoint,
    token: str,
    *,
    number: int,
    command: str,
    user: str,
    state: State,
    out: BuildLog,
    timeout: float,
) -> None:
    """A RUN step's command in its build pod (both runtimes): a login shell as ``user`` through
    the pod's daemon, its output into the build log. The daemon's error, the pod going away or a
    non-zero exit ends the build with that reason (and the exit code, E2B's "exit status N")."""

    async def output(line: str) -> None:
        await out.line(line, step=number)

    shown = command if len(command) <= 200 else command[:200] + "…"
    try:
        code = await commands.run(
            endpoint,
            ProcessConfig(
                cmd="/bin/bash", args=["-l", "-c", command], cwd=state.workdir, envs=state.env
            ),
            user=user,
            access_token=token,
            on_output=output,
            timeout=timeout,
        )
    except EnvdError as e:
        reason = str(e).removeprefix("envd error ")
        raise StepFailed(
            number, f"failed to run command '{shown}': command failed: {reason}"
        ) from e
    except EnvdUnavailable as e:
        raise StepFailed(number, f"failed to run command '{shown}': the build pod went away") from e
    if code != 0:
        raise StepFailed(
            number, f"failed to run command '{shown}': exit status {code}", exit_code=code
        )


class Builder:
    def __init__(
        self,
        *,
        store: Store,
        runtime: BuildRuntime,
        commands: Commands,
        data_dir: Path,
        rootfs: Path,
        step_timeout: float = 1800.0,
        pod_ready_timeout: float = 120.0,
        allow_internet: bool = True,
        egress_allow: tuple[str, ...] = (),
        limits: Limits | None = None,
        unsupported: str | None = None,
    ) -> None:
        self._unsupported = unsupported
        self.store = store
        self._store = store
        self._runtime = runtime
        self._commands = commands
        self._data_dir = data_dir
        self._rootfs = rootfs
        self._step_timeout = step_timeout
        self._ready_timeout = pod_ready_timeout
        self._network = public_only(allow_internet=allow_internet, allow_out=egress_allow)
        self._limits = limits or Limits()

    async def build(self, build_id: str) -> None:
        async with self._holding_layers():
            await self._build(build_id)

    @contextlib.asynccontextmanager
    async def _holding_layers(self) -> AsyncIterator[None]:
        """The whole build holds the layers (shared): the garbage collection waits for it."""
        if self._unsupported is not None:
            yield
            return
        with contextlib.ExitStack() as held:
            # A thread: the lock waits while a collection sweeps; the event loop must not.
            hold = template_layers.in_use_by_a_build(self._data_dir)
            await asyncio.to_thread(held.enter_context, hold)
            yield

    async def _build(self, build_id: str) -> None:
        record = await self._store.get_build(build_id)
        if record is None or record.status is not BuildStatus.BUILDING or record.spec is None:
            return  # finished, deleted, or never started: nothing to do
        structlog.contextvars.bind_contextvars(build_id=build_id)
        out = BuildLog(self._store, build_id)
        started = time.monotonic()
        if self._unsupported is not None:
            await out.line(self._unsupported, level="error")
            await out.flush()
            await self._fail(record, StepFailed(0, self._unsupported), out.tail)
            return
        try:
            artifact, cached = await self._steps(record, record.spec, out)
        except StepFailed as failed:
            await out.line(failed.message, level="error", step=failed.step)
            await out.flush()
            await self._fail(record, failed, out.tail)
            return
        except (TorporError, OSError) as e:
            broken = StepFailed(0, f"the build failed: {e}")
            await out.line(broken.message, level="error")
            await out.flush()
            await self._fail(record, broken, out.tail)
            return
        await self._publish(record, artifact)
        await out.line(f"Build finished in {time.monotonic() - started:.1f}s")
        await out.flush()
        # Tags first: when the SDK sees "ready", creating from the name works already.
        await self._store.update_template(
            record.template_id,
            lambda t: t.model_copy(
                update={"tags": {**t.tags, **dict.fromkeys(record.tags, build_id)}}
            ),
        )
        await self._store.update_build(
            build_id,
            lambda r: r.model_copy(
                update={
                    "status": BuildStatus.READY,
                    "artifact": artifact,
                    "cached_steps": cached,
                    "finished_at": datetime.now(UTC),
                }
            ),
        )
        log.info("template_built", template_id=record.template_id, cached_steps=cached)

    async def _publish(self, record: BuildRecord, artifact: Artifact) -> None:
        """Make the ready build usable by its runtime (here: the local runtime's template)."""
        await asyncio.to_thread(self._write_template, record, artifact)

    async def _fail(self, record: BuildRecord, failed: StepFailed, tail: list[LogLine]) -> None:
        reason = FailureReason(
            message=failed.message,
            step=str(failed.step) if failed.step else None,
            exit_code=failed.exit_code,
            log_entries=tail,
        )
        await self._store.update_build(
            record.build_id,
            lambda r: r.model_copy(
                update={
                    "status": BuildStatus.ERROR,
                    "reason": reason,
                    "finished_at": datetime.now(UTC),
                }
            ),
        )
        log.info("template_build_failed", step=failed.step, exit_code=failed.exit_code)

    async def _base(
        self, spec: BuildSpec, owner: str
    ) -> tuple[str, list[str], State, Artifact | None]:
        # The owner is in every key: a step cached for one tenant is never another's (a cache hit
        # would tell a tenant that somebody ran that exact step, and hand over what it made).
        if spec.base == "template" and spec.base_build_id:
            base = await self._store.get_build(spec.base_build_id)
            if base is None or base.artifact is None:
                raise StepFailed(0, f"the base template's build {spec.base_build_id} is gone")
            art = base.artifact
            state = State(env=dict(art.env), workdir=art.workdir or DEFAULT_WORKDIR, user=art.user)
            return _key("template", owner, spec.base_build_id), list(art.layers), state, art
        marker = await asyncio.to_thread((self._rootfs / MARKER).read_text)
        return _key("debian", owner, marker.strip()), [], State(), None

    async def _steps(
        self, record: BuildRecord, spec: BuildSpec, out: BuildLog
    ) -> tuple[Artifact, list[int]]:
        key, layers, state, base = await self._base(spec, record.owner)
        forcing = spec.force
        cached: list[int] = []
        total = len(spec.steps)
        await out.line(f"Building on {spec.base_image or 'template ' + str(spec.base_build_id)}")
        for number, step in enumerate(spec.steps, 1):
            forcing = forcing or step.force
            step_id = step.model_dump(include={"type", "args", "files_hash"})
            key = _key(
                key, step_id, record.build_id if forcing else None, state.user, state.workdir
            )
            label = f"[{number}/{total}] {step.type} {' '.join(step.args)}"[:500]
            if step.type == "ENV":
                pairs = step.args
                state.env.update(dict(zip(pairs[::2], pairs[1::2], strict=True)))
                await out.line(label, step=number)
                continue
            if step.type == "USER":
                state.user = step.args[0].split(":")[0]
                await out.line(label, step=number)
                continue
            if step.type == "WORKDIR":
                state.workdir = str(PurePosixPath(state.workdir) / step.args[0])
            if not forcing and await asyncio.to_thread(template_layers.exists, self._data_dir, key):
                await asyncio.to_thread(template_layers.touch, self._data_dir, key)
                cached.append(number)
                layers.append(key)
                await out.line(f"CACHED {label}", step=number)
                continue
            await out.line(label, step=number)
            if step.type == "RUN":
                await self._run(
                    record, number=number, step=step, key=key, layers=layers, state=state, out=out
                )
            else:
                await asyncio.to_thread(
                    functools.partial(
                        self._file_step,
                        record,
                        step=step,
                        number=number,
                        key=key,
                        layers=layers,
                        state=state,
                    )
                )
            layers.append(key)
        return build_artifact(spec, state, base, layers=layers), cached

    # ---- steps without a pod ------------------------------------------------------------------

    def _lowers(self, layers: list[str]) -> list[Path]:
        trees = [template_layers.tree(self._data_dir, k) for k in reversed(layers)]
        return [*trees, self._rootfs]

    def _file_step(
        self,
        record: BuildRecord,
        *,
        step: Step,
        number: int,
        key: str,
        layers: list[str],
        state: State,
    ) -> None:
        folder = template_layers.staging(self._data_dir)
        tree = folder / "tree"
        try:
            if step.type == "WORKDIR":
                template_layers.make_parents(
                    tree, PurePosixPath(state.workdir), self._lowers(layers), owner=0
                )
            else:
                self._copy(record, step=step, number=number, tree=tree, layers=layers, state=state)
            template_layers.commit(self._data_dir, folder, key)
        except TorporError as e:
            template_layers.discard(folder)
            raise StepFailed(number, f"{step.type} failed: {e}") from e
        except BaseException:
            template_layers.discard(folder)
            raise

    def _copy(
        self,
        record: BuildRecord,
        *,
        step: Step,
        number: int,
        tree: Path,
        layers: list[str],
        state: State,
    ) -> None:
        assert step.files_hash is not None
        archive = blob_path(self._data_dir / TEMPLATE_FILES_DIR, record.owner, step.files_hash)
        if not archive.is_file():
            raise StepFailed(
                number, f"COPY failed: the files of {step.args[0]!r} were not uploaded"
            )
        args = [*step.args, "", ""]
        user = (args[2] or state.user).split(":")[0]
        owner = template_layers.USER_IDS.get(user, 1000)
        mode = int(args[3], 8) if args[3] else None
        with tempfile.TemporaryDirectory(dir=template_layers.root(self._data_dir)) as scratch:
            template_layers.copy_in(
                archive,
                tree,
                src=step.args[0],
                dest=step.args[1],
                workdir=state.workdir,
                owner=owner,
                mode=mode,
                lowers=self._lowers(layers),
                scratch=Path(scratch),
            )

    # ---- RUN: a build pod ---------------------------------------------------------------------

    async def _run(
        self,
        record: BuildRecord,
        *,
        number: int,
        step: Step,
        key: str,
        layers: list[str],
        state: State,
        out: BuildLog,
    ) -> None:
        command = step.args[0]
        user = step.args[1] if len(step.args) > 1 else state.user
        template = f"bld-{key[:40]}"
        await asyncio.to_thread(self._write_build_template, template, layers, state)
        name = f"bld-{key[:12]}-{secrets.token_hex(4)}"
        token = secrets.token_urlsafe(24)
        spec = WorkloadSpec(
            name=name,
            template=template,
            owner=record.owner,
            labels={BUILD_LABEL: record.build_id},
            access_token=token,
            network=self._network,
            replicas=1,
        )
        await self._runtime.create(spec)
        try:
            endpoint = await self._runtime.wait_ready(name, timeout=self._ready_timeout)
            await self._mkdir_workdir(endpoint, token, state)
            await run_step(
                self._commands,
                endpoint,
                token,
                number=number,
                command=command,
                user=user,
                state=state,
                out=out,
                timeout=self._step_timeout,
            )
            await self._runtime.scale(name, 0)
            await self._runtime.wait_stopped(name, timeout=120)
            folder = template_layers.staging(self._data_dir)
            try:
                await asyncio.to_thread(shutil.rmtree, folder / "tree")
                await self._runtime.export_files(name, folder / "tree")
                await asyncio.to_thread((folder / "tree").chmod, 0o755)
                await asyncio.to_thread(template_layers.commit, self._data_dir, folder, key)
            except BaseException:
                await asyncio.to_thread(template_layers.discard, folder)
                raise
        finally:
            with contextlib.suppress(Exception):
                await self._runtime.delete(name)

    async def _mkdir_workdir(self, endpoint: Endpoint, token: str, state: State) -> None:
        """The step's cwd exists (E2B makes a WORKDIR as it goes)."""

        async def ignore(_: str) -> None:
            return None

        await self._commands.run(
            endpoint,
            ProcessConfig(cmd="/bin/mkdir", args=["-p", "--", state.workdir]),
            user="root",
            access_token=token,
            on_output=ignore,
            timeout=30,
        )

    # ---- template files of the local runtime --------------------------------------------------

    def _write_build_template(self, name: str, layers: list[str], state: State) -> None:
        self._write_yaml(
            name,
            {
                "name": name,
                "workdir": "/",
                "env": {"LANG": "C.UTF-8", "PIP_BREAK_SYSTEM_PACKAGES": "1", **state.env},
                "layers": layers,
                "resources": {
                    "limits": {
                        "memory": self._limits.memory,
                        "cpu": self._limits.cpu,
                        "pids": 4096,
                        "nofile": 65536,
                        "disk": self._limits.disk,
                    }
                },
            },
        )

    def _write_template(self, record: BuildRecord, artifact: Artifact) -> None:
        """The ready build as a template of the local runtime, named by its build id: the
        packaged sandbox template plus the layers, env, user and commands of the build."""
        from shared.runtime.templates import PACKAGED_TEMPLATES_DIR

        base = yaml.safe_load((PACKAGED_TEMPLATES_DIR / "sandbox-base.yaml").read_text())
        base["name"] = record.build_id
        base["env"] = {**base.get("env", {}), **artifact.env}
        base["layers"] = artifact.layers
        base["user"] = artifact.user
        limits = base.setdefault("resources", {}).setdefault("limits", {})
        limits["memory"] = f"{record.memory_mb}Mi"
        limits["cpu"] = str(record.cpu_count)
        for field_name in ("start_cmd", "ready_cmd"):
            value = getattr(artifact, field_name)
            if value:
                base[field_name] = value
        if artifact.start_cmd or artifact.ready_cmd:
            base["start_cwd"] = artifact.workdir or DEFAULT_WORKDIR
        self._write_yaml(record.build_id, base)

    def _write_yaml(self, name: str, content: dict[str, object]) -> None:
        folder = self._data_dir / BUILT_TEMPLATES_DIR
        folder.mkdir(parents=True, exist_ok=True, mode=0o755)
        partial = folder / f".{name}.{secrets.token_hex(4)}.partial"
        partial.write_text(yaml.safe_dump(content, sort_keys=False))
        partial.replace(folder / f"{name}.yaml")
