"""E2B's template API as SDK 2.63 calls it: create a template and a build (``POST /v3/templates``),
the build context's file-hash upload flow (a signed upload URL the API serves itself), start the
build with its steps, its status with the logs so far, names and tags, ``exists``, list, get,
publish and delete. A template belongs to its owner: to anyone else it does not exist (404),
unless an admin published it."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from services.api.deps import Caller, CallerDep, Wiring, WiringDep
from services.api.errors import ApiError, available, error_responses
from services.api.settings import ENVD_VERSION
from services.api.template_builds import TemplateBuilds, find, visible
from services.api.template_schemas import (
    AliasOut,
    AssignedTagsOut,
    AssignTagsIn,
    BuildOut,
    BuildReasonOut,
    BuildStatusOut,
    DeleteTagsIn,
    FileUploadOut,
    LogEntryOut,
    StepIn,
    TagOut,
    TemplateBuildRequest,
    TemplateBuildStart,
    TemplateOut,
    TemplateRequestResponse,
    TemplateUpdateIn,
    TemplateWithBuildsOut,
)
from services.api.uploads import TOKEN_SECONDS, Grant, UploadSigner, store_blob, touch_blob
from shared.bus.subjects import CMD_TEMPLATE_BUILD, of
from shared.errors import Conflict
from shared.models.template_messages import BuildTemplate
from shared.models.template_records import (
    DEFAULT_TAG,
    BuildRecord,
    BuildSpec,
    BuildStatus,
    LogLine,
    NameRecord,
    Step,
    TemplateRecord,
    blob_path,
    is_build_id,
    is_files_hash,
    is_name,
    is_tag,
    is_template_id,
    new_build_id,
    new_template_id,
    split_name,
)

router = APIRouter(tags=["e2b templates"])

_ERRORS = error_responses(400, 401, 403, 404, 409, 413, 429, 501, 503)
# The images the local runtime builds on: its packaged Debian base stands for these.
_DEBIAN_IMAGES = re.compile(
    r"^(docker\.io/)?(library/)?(debian|python|node)(:[A-Za-z0-9_.-]{1,64})?$"
    r"|^e2bdev/base(:[A-Za-z0-9_.-]{1,64})?$"
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_USER = re.compile(r"^(root|user)(:(root|user))?$")
_MODE = re.compile(r"^0?[0-7]{3,4}$")


def _builds(w: Wiring) -> TemplateBuilds:
    return available(w.builds, "template builds are")


def _shown(value: str) -> str:
    return repr(value[:80])


async def _own(w: Wiring, caller: Caller, template_id: str) -> TemplateRecord:
    """The caller's template (an admin's: any); 404 for anything else, even a published one."""
    b = _builds(w)
    record = await b.store.get_template(template_id) if is_template_id(template_id) else None
    if record is None or record.deleting or (record.owner != caller.name and not caller.user.admin):
        raise ApiError(404, f"template {_shown(template_id)} not found")
    return record


async def _find_own(w: Wiring, caller: Caller, ref: str) -> tuple[TemplateRecord, str | None]:
    found = await find(_builds(w), ref, user=caller.name, admin=caller.user.admin)
    if found is None or (found[0].owner != caller.name and not caller.user.admin):
        raise ApiError(404, f"template {_shown(ref)} not found")
    return found


def _now() -> datetime:
    return datetime.now(UTC)


# ---- create a template and a build ----------------------------------------------------------


@router.post(
    "/v3/templates",
    status_code=202,
    response_model=TemplateRequestResponse,
    responses=_ERRORS,
    summary="Create a template (or a new build of the caller's template of that name)",
)
async def request_build(
    w: WiringDep, caller: CallerDep, body: TemplateBuildRequest
) -> TemplateRequestResponse:
    b = _builds(w)
    raw = body.name or body.alias
    if raw is None:
        raise ApiError(400, "name: required")
    name, tag = split_name(raw)
    namespace = raw.partition(":")[0].rpartition("/")[0]
    if namespace and (not is_name(namespace) or "/" in namespace):
        raise ApiError(400, f"name: namespace {_shown(namespace)} is invalid")
    if not is_name(name):
        raise ApiError(
            400,
            f"name: {_shown(name)} is invalid: lowercase letters, digits, '.', '_' and '-', "
            "at most 63 characters, starting with a letter or digit",
        )
    tags = [tag or DEFAULT_TAG]
    for extra in body.tags or []:
        extra_name, extra_tag = split_name(extra)
        value = extra_tag if extra_tag is not None else extra_name
        if not is_tag(value):
            raise ApiError(400, f"tags: {_shown(extra)} is not a valid tag")
        if value not in tags:
            tags.append(value)
    if tag is not None and not is_tag(tag):
        raise ApiError(400, f"name: tag {_shown(tag)} is invalid")
    template = await _template_for_name(w, caller, name, body)
    build = BuildRecord(
        build_id=new_build_id(),
        template_id=template.template_id,
        owner=template.owner,
        tags=tags,
        cpu_count=body.cpu_count or template.cpu_count,
        memory_mb=body.memory_mb or template.memory_mb,
        created_at=_now(),
        updated_at=_now(),
    )
    await b.store.create_build(build)
    await b.store.update_template(
        template.template_id,
        lambda t: t.model_copy(update={"build_count": t.build_count + 1}),
    )
    return TemplateRequestResponse(
        template_id=template.template_id,
        build_id=build.build_id,
        public=template.public,
        names=[name],
        tags=tags,
        aliases=[name],
    )


async def _template_for_name(
    w: Wiring, caller: Caller, name: str, body: TemplateBuildRequest
) -> TemplateRecord:
    b = _builds(w)
    for _ in range(3):
        entry = await b.store.get_name(caller.name, name)
        if entry is not None:
            found = await b.store.get_template(entry.template_id)
            if found is not None and not found.deleting:
                return found
            await b.store.release_name(caller.name, name, entry.template_id)
        mine = [t for t in await b.store.list_templates() if t.owner == caller.name]
        if len(mine) >= b.max_templates:
            raise ApiError(429, f"template quota reached ({b.max_templates} templates per user)")
        record = TemplateRecord(
            template_id=new_template_id(),
            owner=caller.name,
            names=[name],
            cpu_count=body.cpu_count or w.settings.cpu_count,
            memory_mb=body.memory_mb or w.settings.memory_mb,
            created_at=_now(),
            updated_at=_now(),
        )
        await b.store.create_template(record)
        try:
            await b.store.claim_name(
                caller.name,
                NameRecord(template_id=record.template_id, owner=caller.name, name=name),
            )
        except Conflict:  # a concurrent request of the same user took the name: use theirs
            await b.store.delete_template(record.template_id)
            continue
        return record
    raise ApiError(409, f"name: {_shown(name)} is being created concurrently, try again")


# ---- the build context: file hashes and uploads ---------------------------------------------


@router.get(
    "/templates/{template_id}/files/{files_hash}",
    status_code=201,
    response_model=FileUploadOut,
    response_model_exclude_none=True,
    responses=_ERRORS,
    summary="Whether the build context with this hash is uploaded; where to upload it",
)
async def file_upload_link(
    w: WiringDep, caller: CallerDep, request: Request, template_id: str, files_hash: str
) -> FileUploadOut:
    b = _builds(w)
    template = await _own(w, caller, template_id)
    if not is_files_hash(files_hash):
        raise ApiError(400, "hash: must be 64 lowercase hex digits (sha256)")
    present = await asyncio.to_thread(touch_blob, b.blobs, template.owner, files_hash)
    token = UploadSigner(b.signer_key).sign(
        Grant(
            owner=template.owner,
            template_id=template.template_id,
            files_hash=files_hash,
            expires=int(time.time()) + TOKEN_SECONDS,
        )
    )
    url = str(request.base_url).rstrip("/") + f"/templates/uploads/{token}"
    return FileUploadOut(present=present, url=url)


@router.put(
    "/templates/uploads/{token}",
    responses=_ERRORS,
    summary="Upload a build context (the signed URL of the files call; no API key)",
)
async def upload(w: WiringDep, request: Request, token: str) -> Response:
    b = _builds(w)
    grant = UploadSigner(b.signer_key).verify(token)
    if grant is None:
        raise ApiError(403, "the upload URL is invalid or has expired")
    data = await request.body()  # bounded by the gate (max_upload_bytes)
    if len(data) > b.max_upload_bytes:
        raise ApiError(413, f"the upload exceeds {b.max_upload_bytes} bytes")
    await asyncio.to_thread(store_blob, b.blobs, grant.owner, grant.files_hash, data)
    return Response(status_code=200)


# ---- start a build, its status ---------------------------------------------------------------


@router.post(
    "/v2/templates/{template_id}/builds/{build_id}",
    status_code=202,
    responses=_ERRORS,
    summary="Start a build with its steps",
)
async def start_build(
    w: WiringDep, caller: CallerDep, template_id: str, build_id: str, body: TemplateBuildStart
) -> Response:
    b = _builds(w)
    template = await _own(w, caller, template_id)
    build = await b.store.get_build(build_id) if is_build_id(build_id) else None
    if build is None or build.template_id != template.template_id:
        raise ApiError(404, f"build {_shown(build_id)} not found")
    if build.status is not BuildStatus.WAITING:
        raise ApiError(409, f"build {build_id} was started already")
    spec = await _spec(w, caller, template, body)
    running = [
        x
        for t in await b.store.list_templates()
        if t.owner == template.owner
        for x in await b.store.list_builds(t.template_id)
        if x.status is BuildStatus.BUILDING
    ]
    if len(running) >= b.max_concurrent_builds:
        raise ApiError(
            429, f"build quota reached ({b.max_concurrent_builds} concurrent builds per user)"
        )

    def begin(record: BuildRecord) -> BuildRecord:
        if record.status is not BuildStatus.WAITING:
            raise Conflict(f"build {build_id} was started already")
        line = LogLine(timestamp=_now(), message="Build queued")
        return record.model_copy(update={"status": BuildStatus.BUILDING, "spec": spec}).with_logs(
            [line]
        )

    try:
        await b.store.update_build(build_id, begin)
    except Conflict as e:
        raise ApiError(409, str(e)) from e
    message = BuildTemplate(build_id=build_id, template_id=template.template_id)
    await b.publisher.publish(
        message, of(CMD_TEMPLATE_BUILD, build_id), msg_id=f"template_build:{build_id}"
    )
    return Response(status_code=202)


async def _spec(
    w: Wiring, caller: Caller, template: TemplateRecord, body: TemplateBuildStart
) -> BuildSpec:
    b = _builds(w)
    base_build: str | None = None
    if body.from_template is not None:
        if body.from_image is not None:
            raise ApiError(400, "fromImage: give fromImage or fromTemplate, not both")
        found = await find(b, body.from_template, user=caller.name, admin=caller.user.admin)
        base_build = None
        if found is not None:
            base_build = found[0].tags.get(found[1] or DEFAULT_TAG)
        elif _packaged(w, body.from_template):
            # E2B's ``base`` or an operator's template: on the local runtime the Debian rootfs
            return _spec_of(body, None, _steps(body, b, template.owner))
        if base_build is None:
            raise ApiError(
                400, f"fromTemplate: template {_shown(body.from_template)} has no ready build"
            )
    elif body.from_image is not None:
        if not _DEBIAN_IMAGES.match(body.from_image):
            raise ApiError(
                400,
                f"fromImage: {_shown(body.from_image)} is not available on this runtime: "
                "it builds on its packaged Debian base (debian:*, python:*, node:*, e2bdev/base)",
            )
    else:
        raise ApiError(400, "fromImage: give fromImage or fromTemplate")
    steps = _steps(body, b, template.owner)
    for i, step in enumerate(steps):
        if step.files_hash is not None and not await asyncio.to_thread(
            blob_path(b.blobs, template.owner, step.files_hash).is_file
        ):
            raise ApiError(400, f"steps[{i}].filesHash: the files were not uploaded")
    return _spec_of(body, base_build, steps)


def _packaged(w: Wiring, name: str) -> bool:
    resolved = w.settings.resolve_template(name)
    return is_name(name) and w.templates is not None and w.templates.exists(resolved)


def _steps(body: TemplateBuildStart, b: TemplateBuilds, owner: str) -> list[Step]:
    return [_step(i, step, b, owner) for i, step in enumerate(body.steps)]


def _spec_of(body: TemplateBuildStart, base_build: str | None, steps: list[Step]) -> BuildSpec:
    return BuildSpec(
        base="template" if base_build else "debian",
        base_image=body.from_image or (body.from_template if not base_build else None),
        base_build_id=base_build,
        steps=steps,
        force=body.force,
        start_cmd=body.start_cmd,
        ready_cmd=body.ready_cmd,
    )


def _step(i: int, step: StepIn, b: TemplateBuilds, owner: str) -> Step:
    where = f"steps[{i}]"
    args = step.args
    if step.type == "RUN":
        if not 1 <= len(args) <= 2 or not args[0].strip():
            raise ApiError(400, f"{where}.args: RUN takes a command and an optional user")
    elif step.type == "COPY":
        if len(args) < 2 or len(args) > 4 or not args[0] or not args[1]:
            raise ApiError(400, f"{where}.args: COPY takes a source, a destination, user, mode")
        if step.files_hash is None:
            raise ApiError(400, f"{where}.filesHash: required for COPY")
        user = args[2] if len(args) > 2 else ""
        mode = args[3] if len(args) > 3 else ""
        if user and not _USER.match(user):
            raise ApiError(400, f"{where}.args: user {_shown(user)} is not root or user")
        if mode and not _MODE.match(mode):
            raise ApiError(400, f"{where}.args: mode {_shown(mode)} is not an octal mode")
    elif step.type == "ENV":
        if not args or len(args) % 2:
            raise ApiError(400, f"{where}.args: ENV takes name, value pairs")
        for name in args[::2]:
            if not _ENV_NAME.match(name):
                raise ApiError(400, f"{where}.args: {_shown(name)} is not a variable name")
    elif len(args) != 1 or not args[0]:  # WORKDIR, USER
        raise ApiError(400, f"{where}.args: {step.type} takes one value")
    elif step.type == "USER" and not _USER.match(args[0]):
        raise ApiError(400, f"{where}.args: user {_shown(args[0])} is not root or user")
    if step.type != "COPY" and step.files_hash is not None:
        raise ApiError(400, f"{where}.filesHash: only COPY steps have files")
    return Step(
        type=step.type,
        args=list(args),
        files_hash=step.files_hash,
        force=step.force,
        force_upload=step.force_upload,
    )


@router.get(
    "/templates/{template_id}/builds/{build_id}/status",
    response_model=BuildStatusOut,
    response_model_exclude_none=True,
    responses=_ERRORS,
    summary="A build's status and its log entries from logsOffset on",
)
async def build_status(  # noqa: PLR0917 - one parameter per query field of the spec
    w: WiringDep,
    caller: CallerDep,
    template_id: str,
    build_id: str,
    logs_offset: Annotated[int, Query(alias="logsOffset", ge=0, le=10**9)] = 0,
    limit: Annotated[int, Query(ge=0, le=100)] = 100,
    level: Annotated[str | None, Query(pattern="^(debug|info|warn|error)$")] = None,
) -> BuildStatusOut:
    b = _builds(w)
    template = await _own(w, caller, template_id)
    build = await b.store.get_build(build_id) if is_build_id(build_id) else None
    if build is None or build.template_id != template.template_id:
        raise ApiError(404, f"build {_shown(build_id)} not found")
    start = max(0, logs_offset - build.logs_dropped)
    lines = build.logs[start : start + limit]
    if level is not None:
        order = ["debug", "info", "warn", "error"]
        lines = [x for x in lines if order.index(x.level) >= order.index(level)]
    entries = [_entry(x) for x in lines]
    reason = None
    if build.reason is not None:
        reason = BuildReasonOut(
            message=build.reason.message,
            step=build.reason.step,
            log_entries=[_entry(x) for x in build.reason.log_entries],
        )
    status = build.status.value
    if status == "ready" and start + limit < len(build.logs):
        status = "building"  # the SDK stops polling at ready: let it drain the logs first
    return BuildStatusOut(
        logs=[x.message for x in lines],
        log_entries=entries,
        template_id=template.template_id,
        build_id=build.build_id,
        status=status,
        reason=reason,
    )


def _entry(line: LogLine) -> LogEntryOut:
    return LogEntryOut(
        timestamp=line.timestamp, level=line.level, message=line.message, step=line.step
    )


# ---- names, tags, exists ---------------------------------------------------------------------


@router.get(
    "/templates/aliases/{alias}",
    response_model=AliasOut,
    responses=_ERRORS,
    summary="Whether a template of this name exists for the caller (Template.exists)",
)
async def alias_exists(w: WiringDep, caller: CallerDep, alias: str) -> AliasOut:
    found = await find(_builds(w), alias, user=caller.name, admin=caller.user.admin)
    if found is not None:
        return AliasOut(template_id=found[0].template_id, public=found[0].public)
    packaged = w.settings.resolve_template(alias)
    if w.templates is not None and is_name(alias) and w.templates.exists(packaged):
        return AliasOut(template_id=alias, public=True)  # the operator's templates: everyone's
    raise ApiError(404, f"template {_shown(alias)} not found")


@router.post(
    "/templates/tags",
    status_code=201,
    response_model=AssignedTagsOut,
    responses=_ERRORS,
    summary="Give a ready build more tags",
)
async def assign_tags(w: WiringDep, caller: CallerDep, body: AssignTagsIn) -> AssignedTagsOut:
    b = _builds(w)
    template, tag = await _find_own(w, caller, body.target)
    build_id = template.tags.get(tag or DEFAULT_TAG)
    if build_id is None:
        raise ApiError(404, f"target: {_shown(body.target)} has no ready build")
    tags = [_tag_value(template, t, field="tags") for t in body.tags]

    def add(record: TemplateRecord) -> TemplateRecord:
        return record.model_copy(update={"tags": {**record.tags, **dict.fromkeys(tags, build_id)}})

    await b.store.update_template(template.template_id, add)
    return AssignedTagsOut(tags=tags, build_id=build_id)


def _tag_value(template: TemplateRecord, value: str, *, field: str) -> str:
    """A tag alone, or ``name:tag`` of this very template."""
    name, tag = split_name(value)
    if tag is None:
        tag, name = name, ""
    elif not name:  # ":tag": a name left out is no name (E2B refuses it too)
        raise ApiError(400, f"{field}: {_shown(value)} has no template name before ':'")
    if not is_tag(tag) or (name and name not in template.names):
        raise ApiError(400, f"{field}: {_shown(value)} is not a tag of this template")
    return tag


@router.delete(
    "/templates/tags",
    status_code=204,
    responses=_ERRORS,
    summary="Remove tags from a template",
)
async def remove_tags(w: WiringDep, caller: CallerDep, body: DeleteTagsIn) -> Response:
    b = _builds(w)
    template, _ = await _find_own(w, caller, body.name)
    tags = [_tag_value(template, t, field="tags") for t in body.tags]
    missing = [t for t in tags if t not in template.tags]
    if missing:
        raise ApiError(404, f"tags: {_shown(missing[0])} not found")

    def drop(record: TemplateRecord) -> TemplateRecord:
        return record.model_copy(
            update={"tags": {k: v for k, v in record.tags.items() if k not in tags}}
        )

    await b.store.update_template(template.template_id, drop)
    return Response(status_code=204)


@router.get(
    "/templates/{template_id}/tags",
    response_model=list[TagOut],
    responses=_ERRORS,
    summary="A template's tags and the builds they name",
)
async def list_tags(w: WiringDep, caller: CallerDep, template_id: str) -> list[TagOut]:
    b = _builds(w)
    template, _ = await _find_own(w, caller, template_id)
    out = []
    for tag, build_id in sorted(template.tags.items()):
        build = await b.store.get_build(build_id)
        when = (build.finished_at or build.created_at) if build else template.updated_at
        out.append(TagOut(tag=tag, build_id=build_id, created_at=when))
    return out


# ---- list, get, publish, delete --------------------------------------------------------------


async def _out(b: TemplateBuilds, w: Wiring, t: TemplateRecord) -> TemplateOut:
    builds = await b.store.list_builds(t.template_id)
    latest = builds[-1] if builds else None
    return TemplateOut(
        template_id=t.template_id,
        build_id=t.default_build or (latest.build_id if latest else ""),
        cpu_count=t.cpu_count,
        memory_mb=t.memory_mb,
        disk_size_mb=w.settings.disk_size_mb,
        public=t.public,
        aliases=list(t.names),
        names=list(t.names),
        created_at=t.created_at,
        updated_at=t.updated_at,
        last_spawned_at=t.last_spawned_at,
        spawn_count=t.spawn_count,
        build_count=t.build_count,
        envd_version=ENVD_VERSION,
        build_status=(latest.status.value if latest else BuildStatus.WAITING.value),
    )


@router.get(
    "/templates",
    response_model=list[TemplateOut],
    responses=_ERRORS,
    summary="The caller's templates and the published ones",
)
async def list_templates(
    w: WiringDep,
    caller: CallerDep,
    team_id: Annotated[None, Query(alias="teamID")] = None,
) -> list[TemplateOut]:
    b = _builds(w)
    shown = [
        t
        for t in await b.store.list_templates()
        if visible(t, caller.name, admin=caller.user.admin)
    ]
    return [await _out(b, w, t) for t in sorted(shown, key=lambda t: t.created_at)]


@router.get(
    "/templates/{template_id}",
    response_model=TemplateWithBuildsOut,
    responses=_ERRORS,
    summary="A template and its builds",
)
async def get_template(w: WiringDep, caller: CallerDep, template_id: str) -> TemplateWithBuildsOut:
    b = _builds(w)
    found = await find(b, template_id, user=caller.name, admin=caller.user.admin)
    if found is None:
        raise ApiError(404, f"template {_shown(template_id)} not found")
    template = found[0]
    base = await _out(b, w, template)
    builds = [
        BuildOut(
            build_id=x.build_id,
            status=x.status.value,
            created_at=x.created_at,
            updated_at=x.updated_at,
            finished_at=x.finished_at,
            cpu_count=x.cpu_count,
            memory_mb=x.memory_mb,
        )
        for x in await b.store.list_builds(template.template_id)
    ]
    return TemplateWithBuildsOut(**base.model_dump(), builds=builds)


@router.patch(
    "/templates/{template_id}",
    responses=_ERRORS,
    summary="Publish a template (admins only) or make it private again",
)
@router.patch(
    "/v2/templates/{template_id}",
    responses=_ERRORS,
    summary="Publish a template (admins only) or make it private again",
)
async def update_template(
    w: WiringDep, caller: CallerDep, template_id: str, body: TemplateUpdateIn
) -> dict[str, list[str]]:
    b = _builds(w)
    template = await _own(w, caller, template_id)
    if body.public is not None and body.public != template.public:
        if not caller.user.admin:
            raise ApiError(403, "public: only an admin can publish a template")
        for name in template.names:
            if body.public:
                try:
                    await b.store.claim_name(
                        None,
                        NameRecord(
                            template_id=template.template_id, owner=template.owner, name=name
                        ),
                    )
                except Conflict as e:
                    raise ApiError(409, f"public: the name {name!r} is published already") from e
            else:
                await b.store.release_name(None, name, template.template_id)
        public = body.public
        await b.store.update_template(
            template.template_id, lambda t: t.model_copy(update={"public": public})
        )
    return {"names": list(template.names)}


async def delete_template(w: Wiring, caller: Caller, template_id: str) -> None:
    """``DELETE /templates/{id}`` for a template (the snapshots route hands non-snapshot ids
    here). Its sandboxes keep running; no new one can start from it."""
    b = _builds(w)
    template = await _own(w, caller, template_id)
    await b.store.update_template(
        template.template_id, lambda t: t.model_copy(update={"deleting": True})
    )
    for name in template.names:
        await b.store.release_name(template.owner, name, template.template_id)
        await b.store.release_name(None, name, template.template_id)
    for build in await b.store.list_builds(template.template_id):
        await b.store.delete_build(build.build_id)
    await b.store.delete_template(template.template_id)


async def build_for_create(w: Wiring, caller: Caller, ref: str) -> str | None:
    """The ready build a create of ``ref`` starts from (its name is the runtime's template
    name), ``None`` when ``ref`` is no user template; 400 for one without a ready build."""
    if w.builds is None:
        return None
    found = await find(w.builds, ref, user=caller.name, admin=caller.user.admin)
    if found is None:
        return None
    template, tag = found
    build_id = template.tags.get(tag or DEFAULT_TAG)
    if build_id is None:
        raise ApiError(400, f"templateID: template {_shown(ref)} has no ready build")
    return build_id
