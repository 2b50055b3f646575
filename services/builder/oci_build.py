"""One build on Kubernetes: an OCI image pushed to the configured registry, and a PodTemplate
object (named by the build id) whose pod runs that image by digest.

- The steps run in one **build pod**: a sandbox pod (the sandbox-base pod template: the
  in-sandbox daemon, no ServiceAccount token, the builder's NetworkPolicy, limits) started from
  the image of the longest cached prefix of the steps. Its daemon runs as root (E2B's steps
  run as root or ``user``) with only the capabilities a package manager needs, no privilege
  escalation; it has no registry credentials and no volume: everything a step writes lands in
  the container's own layer.
- After each step that changes files (RUN, COPY, WORKDIR), ``pod_diff`` (run in the pod as
  root) writes what changed since the step before as a tar with OCI whiteouts; the builder
  downloads it, checks and repacks it (``shared.oci.layers``: hostile input) and pushes it as a
  layer, then the image so far as ``cache-<key>`` in the cache repository. A step's key is the
  sha256 of the owner, the key before it (down to the base image's digest) and the step, so a
  rebuild starts from the longest cached prefix and no tenant ever gets another's layers.
- COPY: the context's matching entries, as a tar (``oci_copy``) unpacked at ``/`` in the pod.
- The final image (the base's config plus the build's env, working folder and labels) goes to
  the template's own repository, tagged with the build id. The builder names every repository;
  nothing a tenant sends becomes one.

The parts: ``.oci_plans`` (the plan, the step keys), ``.build_pod`` (the daemon as root) and
``.oci_templates`` (the build pod's and the built template's pod templates).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import structlog

from services.builder import oci_copy, oci_plans, oci_templates, pod_diff
from services.builder.build_pod import (
    COPY_FILE,
    LAYER_FILE,
    OWN_USER_FOLDERS,
    PYTHON,
    STATE_FILE,
    BuildPod,
    PodFiles,
)
from services.builder.building import Builder
from services.builder.builds import (
    BUILD_LABEL,
    DEFAULT_WORKDIR,
    BuildLog,
    Limits,
    State,
    StepFailed,
    Store,
    build_artifact,
    copy_args,
)
from services.builder.oci_plans import FILE_STEPS, ImageRef, Parent, Planned
from services.builder.oci_templates import SANDBOX_BASE
from services.builder.running import run_step
from shared.models.template_records import (
    Artifact,
    BuildRecord,
    BuildSpec,
    Step,
)
from shared.oci import images
from shared.oci.images import BadImage, Image
from shared.oci.layers import MAX_LAYER_BYTES, BadLayer, repack
from shared.oci.registry import Registry, RegistryError, check_repository
from shared.ports.runtime import Runtime
from shared.ports.workloads import WorkloadSpec

log = structlog.get_logger()


class ImageRuntime(Runtime, Protocol):
    """The Kubernetes runtime: the runtime port plus the pod templates of built templates."""

    async def pod_template(self, name: str) -> dict[str, Any]: ...
    async def put_pod_template(
        self, name: str, template: dict[str, Any], *, build_id: str
    ) -> None: ...
    async def delete_pod_template(self, name: str) -> None: ...


class ImageBuilder(Builder):
    def __init__(
        self,
        *,
        store: Store,
        runtime: ImageRuntime,
        commands: PodFiles,
        registry: Registry,
        prefix: str,
        base_image: str,
        data_dir: Path,
        step_timeout: float = 1800.0,
        pod_ready_timeout: float = 240.0,
        allow_internet: bool = True,
        egress_allow: tuple[str, ...] = (),
        limits: Limits | None = None,
        max_layer_bytes: int = MAX_LAYER_BYTES,
    ) -> None:
        super().__init__(
            store=store,
            runtime=runtime,  # type: ignore[arg-type]  # no local layer export here
            commands=commands,
            data_dir=data_dir,
            rootfs=Path("/nonexistent"),
            step_timeout=step_timeout,
            pod_ready_timeout=pod_ready_timeout,
            allow_internet=allow_internet,
            egress_allow=egress_allow,
            limits=limits,
        )
        self._k8s = runtime
        self._files = commands
        self._registry = registry
        self._prefix = prefix.strip("/")
        self._base_ref = ImageRef.parse(base_image)
        self._max_layer = max_layer_bytes
        self._script = Path(pod_diff.__file__).read_text()

    @contextlib.asynccontextmanager
    async def _holding_layers(self) -> AsyncIterator[None]:
        yield  # no local layers here: the images are the registry's

    # ---- names (the builder's, never the tenant's) ---------------------------------------------

    def _repo(self, *parts: str) -> str:
        return check_repository("/".join(p for p in (self._prefix, *parts) if p))

    @property
    def _cache_repo(self) -> str:
        return self._repo("cache")

    def _template_repo(self, template_id: str) -> str:
        return self._repo("templates", template_id)

    def _pull_ref(self, parent: Parent) -> str:
        return f"{self._registry.host}/{parent.repository}@{parent.digest}"

    # ---- the steps -----------------------------------------------------------------------------

    async def _load(self, repository: str, reference: str) -> Parent | None:
        found = await self._registry.get_manifest(repository, reference)
        if found is None:
            return None
        config_desc, layers = images.parse_manifest(found.data)
        config = images.parse_config(await self._registry.get_blob(repository, config_desc.digest))
        if len(config["rootfs"]["diff_ids"]) != len(layers):
            raise BadImage(f"{repository}@{found.digest}: layers and diff ids differ")
        return Parent(repository, found.digest, Image(layers, config))

    async def _start(self, spec: BuildSpec) -> tuple[Parent, State, Artifact | None]:
        if spec.base == "template" and spec.base_build_id:
            base = await self._store.get_build(spec.base_build_id)
            if base is None or base.artifact is None:
                raise StepFailed(0, f"the base template's build {spec.base_build_id} is gone")
            art = base.artifact
            if art.image is None or not art.image.startswith(self._registry.host + "/"):
                raise StepFailed(0, "the base template was not built as an image of this registry")
            ref = ImageRef.parse(art.image.removeprefix(self._registry.host + "/"))
            state = State(env=dict(art.env), workdir=art.workdir or DEFAULT_WORKDIR, user=art.user)
        else:
            ref, state, art = self._base_ref, State(), None
        parent = await self._load(ref.repository, ref.reference)
        if parent is None:
            raise StepFailed(
                0, f"the base image {ref.repository}:{ref.reference} is not in the registry"
            )
        return parent, state, art

    async def _steps(
        self, record: BuildRecord, spec: BuildSpec, out: BuildLog
    ) -> tuple[Artifact, list[int]]:
        try:
            parent, state, base = await self._start(spec)
            await out.line(
                f"Building on {spec.base_image or 'template ' + str(spec.base_build_id)}"
            )
            planned = oci_plans.plan(record, spec, parent, state)
            total = len(planned)
            cached: list[int] = []
            todo = list(planned)
            while todo:  # the longest cached prefix
                entry = todo[0]
                label = oci_plans.label(entry, total)
                if entry.step.type in FILE_STEPS:
                    hit = (
                        None
                        if entry.forced
                        else await self._load(self._cache_repo, oci_plans.cache_tag(entry.key))
                    )
                    if hit is None:
                        break
                    parent = hit
                    cached.append(entry.number)
                    await out.line(f"CACHED {label}", step=entry.number)
                else:
                    await out.line(label, step=entry.number)
                todo.pop(0)
            if any(e.step.type in FILE_STEPS for e in todo):
                parent = await self._in_pod(record, parent, todo, total, out)
            else:
                for entry in todo:
                    await out.line(oci_plans.label(entry, total), step=entry.number)
            final_state = planned[-1].state if planned else state
            image = await self._publish_image(record, spec, parent, final_state, base)
        except (BadImage, RegistryError) as e:
            raise StepFailed(0, f"the build failed: {e}") from e
        return build_artifact(spec, final_state, base, image=image), cached

    async def _in_pod(
        self, record: BuildRecord, parent: Parent, todo: list[Planned], total: int, out: BuildLog
    ) -> Parent:
        template_name = f"bld-{record.build_id}"
        name = f"bld-{todo[0].key[:12]}-{secrets.token_hex(4)}"
        token = secrets.token_urlsafe(24)
        await self._k8s.put_pod_template(
            template_name, await self._build_pod_template(parent), build_id=record.build_id
        )
        present: set[str] = set()
        try:
            await self._k8s.create(
                WorkloadSpec(
                    name=name,
                    template=template_name,
                    owner=record.owner,
                    labels={BUILD_LABEL: record.build_id},
                    access_token=token,
                    network=self._network,
                    replicas=1,
                )
            )
            endpoint = await self._k8s.wait_ready(name, timeout=self._ready_timeout)
            pod = BuildPod(self._files, endpoint, token)
            await pod.root(0, [PYTHON, "-c", self._script, "snap", "/", STATE_FILE])
            # The user's folders are the user's in a built image (in sandbox-base they are
            # root's: sandboxes mount volumes there); the first step's layer carries the change.
            await pod.root(0, ["/bin/sh", "-c", OWN_USER_FOLDERS])
            with tempfile.TemporaryDirectory(prefix="torpor-build-") as scratch:
                for entry in todo:
                    await out.line(oci_plans.label(entry, total), step=entry.number)
                    if entry.step.type not in FILE_STEPS:
                        continue
                    await self._one(record, pod, entry, Path(scratch), out)
                    parent = await self._layer(pod, entry, parent, Path(scratch), present)
        finally:
            with contextlib.suppress(Exception):
                await self._k8s.delete(name)
            with contextlib.suppress(Exception):
                await self._k8s.delete_pod_template(template_name)
        return parent

    async def _one(
        self, record: BuildRecord, pod: BuildPod, entry: Planned, scratch: Path, out: BuildLog
    ) -> None:
        step, state, number = entry.step, entry.state, entry.number
        if step.type == "WORKDIR":
            await pod.root(number, ["/bin/mkdir", "-p", "--", state.workdir])
            return
        if step.type == "COPY":
            tar = scratch / "copy.tar"
            await asyncio.to_thread(self._copy_tar, record, step, state, tar, number)
            await pod.upload(number, tar, COPY_FILE)
            await pod.root(
                number,
                [
                    "/bin/tar",
                    "-x",
                    "-p",
                    "--numeric-owner",
                    "--no-overwrite-dir",
                    "-f",
                    COPY_FILE,
                    "-C",
                    "/",
                ],
            )
            await pod.root(number, ["/bin/rm", "-f", "--", COPY_FILE])
            return
        command = step.args[0]
        user = step.args[1] if len(step.args) > 1 else state.user
        await pod.root(number, ["/bin/mkdir", "-p", "--", state.workdir])

        await run_step(
            self._commands,
            pod.endpoint,
            pod.token,
            number=number,
            command=command,
            user=user,
            state=state,
            out=out,
            timeout=self._step_timeout,
        )

    def _copy_tar(
        self, record: BuildRecord, step: Step, state: State, tar: Path, number: int
    ) -> None:
        copy = copy_args(self._data_dir, record.owner, step, state, number)
        try:
            oci_copy.copy_tar(
                copy.archive,
                tar,
                src=copy.src,
                dest=copy.dest,
                workdir=state.workdir,
                owner=copy.owner,
                mode=copy.mode,
            )
        except (oci_copy.BadCopy, ValueError) as e:
            raise StepFailed(number, f"COPY failed: {e}") from e

    async def _layer(
        self, pod: BuildPod, entry: Planned, parent: Parent, scratch: Path, present: set[str]
    ) -> Parent:
        """The step's diff as a layer on ``parent``, pushed with its image as the cache."""
        number = entry.number
        await pod.root(number, [PYTHON, "-c", self._script, "diff", "/", STATE_FILE, LAYER_FILE])
        raw, clean = scratch / "raw.tar", scratch / "layer.tar"
        await pod.download(number, LAYER_FILE, raw, self._max_layer)
        await pod.root(number, ["/bin/rm", "-f", "--", LAYER_FILE])
        try:
            blob = await asyncio.to_thread(repack, raw, clean, max_bytes=self._max_layer)
        except BadLayer as e:
            raise StepFailed(number, f"the step's files cannot be an image layer: {e}") from e
        repo = self._cache_repo
        await self._ensure_blobs(repo, parent, present)
        await self._registry.push_blob(repo, clean, blob.digest)
        present.add(blob.digest)
        image = images.with_layer(parent.image, blob, created_by=oci_plans.label(entry, 0))
        await self._registry.push_bytes(repo, image.config_bytes())
        digest = await self._registry.put_manifest(
            repo, oci_plans.cache_tag(entry.key), image.manifest_bytes()
        )
        return Parent(repo, digest, image)

    async def _ensure_blobs(self, repo: str, parent: Parent, present: set[str]) -> None:
        for layer in parent.image.layers:
            if layer.digest not in present:
                await self._registry.copy_blob(repo, layer.digest, source=parent.repository)
                present.add(layer.digest)

    async def _publish_image(
        self,
        record: BuildRecord,
        spec: BuildSpec,
        parent: Parent,
        state: State,
        base: Artifact | None,
    ) -> str:
        labels = {images.LABEL_BUILD: record.build_id}
        start = spec.start_cmd if spec.start_cmd is not None else (base.start_cmd if base else None)
        ready = spec.ready_cmd if spec.ready_cmd is not None else (base.ready_cmd if base else None)
        if start:
            labels[images.LABEL_START] = start
        if ready:
            labels[images.LABEL_READY] = ready
        image = images.with_settings(
            parent.image, env=state.env, workdir=state.workdir, labels=labels
        )
        repo = self._template_repo(record.template_id)
        await self._ensure_blobs(repo, parent, set())
        await self._registry.push_bytes(repo, image.config_bytes())
        digest = await self._registry.put_manifest(repo, record.build_id, image.manifest_bytes())
        return f"{self._registry.host}/{repo}@{digest}"

    # ---- pod templates -------------------------------------------------------------------------

    async def _build_pod_template(self, parent: Parent) -> dict[str, Any]:
        template = await self._k8s.pod_template(SANDBOX_BASE)
        return oci_templates.build_pod_template(template, self._pull_ref(parent), self._limits)

    async def _publish(self, record: BuildRecord, artifact: Artifact) -> None:
        """The template's pod template (see ``oci_templates.built_template``)."""
        template = await self._k8s.pod_template(SANDBOX_BASE)
        oci_templates.built_template(template, record, artifact)
        await self._k8s.put_pod_template(record.build_id, template, build_id=record.build_id)
