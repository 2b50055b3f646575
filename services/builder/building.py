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

Its parts: ``.builds`` (ports, state, log, keys), ``.running`` (a RUN step's command),
``.file_steps`` (COPY and WORKDIR) and ``.local_templates`` (the template files).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
import shutil
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

import structlog

from services.builder import file_steps, local_templates
from services.builder.builds import (
    BUILD_LABEL,
    DEFAULT_WORKDIR,
    BuildLog,
    BuildRuntime,
    Commands,
    Limits,
    State,
    StepFailed,
    Store,
    build_artifact,
    step_key,
)
from services.builder.running import run_step
from shared.errors import TorporError
from shared.models.network import public_only
from shared.models.snapshots import ProcessConfig
from shared.models.template_records import (
    Artifact,
    BuildRecord,
    BuildSpec,
    BuildStatus,
    FailureReason,
    LogLine,
    Step,
)
from shared.ports.workloads import Endpoint, WorkloadSpec
from shared.runtime.local import template_layers
from shared.runtime.local.rootfs import MARKER

log = structlog.get_logger()


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
        await asyncio.to_thread(local_templates.write_template, self._data_dir, record, artifact)

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
            return step_key("template", owner, spec.base_build_id), list(art.layers), state, art
        marker = await asyncio.to_thread((self._rootfs / MARKER).read_text)
        return step_key("debian", owner, marker.strip()), [], State(), None

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
            key = step_key(
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
                        file_steps.file_step,
                        self._data_dir,
                        self._rootfs,
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
        await asyncio.to_thread(
            local_templates.write_build_template,
            self._data_dir,
            template,
            layers,
            state,
            self._limits,
        )
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
