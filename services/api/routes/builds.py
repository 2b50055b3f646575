"""E2B's template builds as SDK 2.63 calls them: create a template and a build (``POST
/v3/templates``), the build context's file-hash upload flow (a signed upload URL the API serves
itself), start the build with its steps (``.template_steps``), its status with the logs so far."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from services.api.deps import Caller, CallerDep, Wiring, WiringDep
from services.api.errors import ApiError
from services.api.routes.template_access import ERRORS, builds_of, now, own, shown
from services.api.routes.template_steps import build_spec
from services.api.template_schemas import (
    BuildReasonOut,
    BuildStatusOut,
    FileUploadOut,
    LogEntryOut,
    TemplateBuildRequest,
    TemplateBuildStart,
    TemplateRequestResponse,
)
from services.api.uploads import TOKEN_SECONDS, Grant, UploadSigner, store_blob, touch_blob
from shared.bus.subjects import CMD_TEMPLATE_BUILD, of
from shared.errors import Conflict
from shared.models.template_messages import BuildTemplate
from shared.models.template_records import (
    DEFAULT_TAG,
    BuildRecord,
    BuildStatus,
    LogLine,
    NameRecord,
    TemplateRecord,
    is_build_id,
    is_files_hash,
    is_name,
    is_tag,
    new_build_id,
    new_template_id,
    split_name,
)

router = APIRouter()


# ---- create a template and a build ----------------------------------------------------------


@router.post(
    "/v3/templates",
    status_code=202,
    response_model=TemplateRequestResponse,
    responses=ERRORS,
    summary="Create a template (or a new build of the caller's template of that name)",
)
async def request_build(
    w: WiringDep, caller: CallerDep, body: TemplateBuildRequest
) -> TemplateRequestResponse:
    b = builds_of(w)
    raw = body.name or body.alias
    if raw is None:
        raise ApiError(400, "name: required")
    name, tag = split_name(raw)
    namespace = raw.partition(":")[0].rpartition("/")[0]
    if namespace and (not is_name(namespace) or "/" in namespace):
        raise ApiError(400, f"name: namespace {shown(namespace)} is invalid")
    if not is_name(name):
        raise ApiError(
            400,
            f"name: {shown(name)} is invalid: lowercase letters, digits, '.', '_' and '-', "
            "at most 63 characters, starting with a letter or digit",
        )
    tags = [tag or DEFAULT_TAG]
    for extra in body.tags or []:
        extra_name, extra_tag = split_name(extra)
        value = extra_tag if extra_tag is not None else extra_name
        if not is_tag(value):
            raise ApiError(400, f"tags: {shown(extra)} is not a valid tag")
        if value not in tags:
            tags.append(value)
    if tag is not None and not is_tag(tag):
        raise ApiError(400, f"name: tag {shown(tag)} is invalid")
    template = await _template_for_name(w, caller, name, body)
    build = BuildRecord(
        build_id=new_build_id(),
        template_id=template.template_id,
        owner=template.owner,
        tags=tags,
        cpu_count=body.cpu_count or template.cpu_count,
        memory_mb=body.memory_mb or template.memory_mb,
        created_at=now(),
        updated_at=now(),
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
    b = builds_of(w)
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
            created_at=now(),
            updated_at=now(),
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
    raise ApiError(409, f"name: {shown(name)} is being created concurrently, try again")


# ---- the build context: file hashes and uploads ---------------------------------------------


@router.get(
    "/templates/{template_id}/files/{files_hash}",
    status_code=201,
    response_model=FileUploadOut,
    response_model_exclude_none=True,
    responses=ERRORS,
    summary="Whether the build context with this hash is uploaded; where to upload it",
)
async def file_upload_link(
    w: WiringDep, caller: CallerDep, request: Request, template_id: str, files_hash: str
) -> FileUploadOut:
    b = builds_of(w)
    template = await own(w, caller, template_id)
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
    responses=ERRORS,
    summary="Upload a build context (the signed URL of the files call; no API key)",
)
async def upload(w: WiringDep, request: Request, token: str) -> Response:
    b = builds_of(w)
    grant = UploadSigner(b.signer_key).verify(token)
    if grant is None:
        raise ApiError(403, "the upload URL is invalid or has expired")
    data = await request.body()  # bounded by the gate (max_upload_bytes)
    if len(data) > b.max_upload_bytes:
        raise ApiError(413, f"the upload exceeds {b.max_upload_bytes} bytes")
    await asyncio.to_thread(store_blob, b.blobs, grant.owner, grant.files_hash, data)
    return Response(status_code=200)


# ---- start a build, its status ---------------------------------------------------------------


async def _own_build(
    w: Wiring, caller: Caller, template_id: str, build_id: str
) -> tuple[TemplateRecord, BuildRecord]:
    """The caller's template and its build ``build_id``; 404 for a build of another template."""
    template = await own(w, caller, template_id)
    build = await builds_of(w).store.get_build(build_id) if is_build_id(build_id) else None
    if build is None or build.template_id != template.template_id:
        raise ApiError(404, f"build {shown(build_id)} not found")
    return template, build


@router.post(
    "/v2/templates/{template_id}/builds/{build_id}",
    status_code=202,
    responses=ERRORS,
    summary="Start a build with its steps",
)
async def start_build(
    w: WiringDep, caller: CallerDep, template_id: str, build_id: str, body: TemplateBuildStart
) -> Response:
    b = builds_of(w)
    template, build = await _own_build(w, caller, template_id, build_id)
    if build.status is not BuildStatus.WAITING:
        raise ApiError(409, f"build {build_id} was started already")
    spec = await build_spec(w, caller, template, body)
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
        line = LogLine(timestamp=now(), message="Build queued")
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


@router.get(
    "/templates/{template_id}/builds/{build_id}/status",
    response_model=BuildStatusOut,
    response_model_exclude_none=True,
    responses=ERRORS,
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
    template, build = await _own_build(w, caller, template_id, build_id)
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
