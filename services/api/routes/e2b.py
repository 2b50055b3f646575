"""The E2B-compatible REST API: every call the ``e2b`` SDK 2.x makes, both path generations
(``/sandboxes…`` and ``/v2/sandboxes…``), with the exact status codes the SDK maps (docs/api.md)."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Annotated, Literal
from urllib.parse import parse_qsl, unquote

import structlog
from fastapi import APIRouter, Header, Query, Response, status

from services.api.deps import CallerDep, WiringDep, require_template
from services.api.errors import ApiError, error_responses, refuse_resume_if_up
from services.api.insecure import wants_token
from services.api.paging import cut_page, token_cursor
from services.api.quotas import admit_create, admit_resume
from services.api.routes.snapshots import snapshot_request
from services.api.routes.templates import build_for_create
from services.api.schemas import (
    ConnectSandbox,
    ListedSandboxOut,
    NetworkUpdate,
    NewSandbox,
    PauseRequest,
    RefreshRequest,
    ResumedSandbox,
    SandboxDetailOut,
    SandboxOut,
    TimeoutRequest,
)
from services.api.template_builds import template_ids
from services.api.views import detail_out, listed_out, sandbox_out, shown_template, visible
from shared.domain import states
from shared.domain.record import SandboxRecord
from shared.errors import Conflict, NotFound
from shared.ids import is_valid_sandbox_id
from shared.models.lifecycle import NO_HOOKS
from shared.models.snapshot_records import looks_like_snapshot_id
from shared.ports.lifecycle import CreateRequest
from shared.spans import Spans

log = structlog.get_logger()

router = APIRouter(tags=["e2b"])

_ERRORS = error_responses(400, 401, 404, 409, 429, 500, 503, 504)


def _id_or_404(sandbox_id: str) -> str:
    # E2B paths answer 404 for ids that cannot exist (the SDK maps 404, not 422).
    if not is_valid_sandbox_id(sandbox_id):
        raise ApiError(404, f"sandbox {sandbox_id} not found")
    return sandbox_id


async def _get(w: WiringDep, caller: CallerDep, sandbox_id: str) -> SandboxRecord:
    record = await w.lifecycle.get(_id_or_404(sandbox_id), owner=caller.scope)
    if not visible(record):
        raise ApiError(404, f"sandbox {sandbox_id} not found")
    return record


def _timeout(w: WiringDep, value: int | None, *, default: int | None = None) -> int:
    chosen = value if value else (default or w.settings.default_timeout)
    if chosen > w.settings.max_timeout:
        raise ApiError(400, f"timeout must be at most {w.settings.max_timeout} seconds")
    return chosen


def _idempotent_id(owner: str, key: str) -> str:
    """A retried create with the same key targets the same sandbox id, across replicas."""
    digest = hashlib.sha256(f"{owner}\0{key}".encode()).hexdigest()
    return f"i{digest[:24]}"


@router.post(
    "/sandboxes",
    status_code=201,
    response_model=SandboxOut,
    responses=_ERRORS,
    summary="Create a sandbox (SDK < 2.52)",
)
@router.post(
    "/v2/sandboxes",
    status_code=201,
    response_model=SandboxOut,
    responses=_ERRORS,
    summary="Create a sandbox",
)
async def create_sandbox(
    w: WiringDep,
    caller: CallerDep,
    body: NewSandbox,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> SandboxOut:
    spans = Spans()
    from_snapshot = looks_like_snapshot_id(body.template_id)
    built = None if from_snapshot else await build_for_create(w, caller, body.template_id)
    template = built or w.settings.resolve_template(body.template_id)
    if not from_snapshot and built is None:
        require_template(w, template, field="templateID")
    secure = wants_token(w.settings, body.secure, idempotency_key, body.network_policy())
    request = CreateRequest(
        owner=caller.name,
        secure=secure,
        sandbox_id=_idempotent_id(caller.name, idempotency_key) if idempotency_key else None,
        template=template,
        timeout=_timeout(w, body.timeout),
        auto_pause=body.wants_auto_pause(),
        auto_pause_memory=body.auto_pause_memory is True,
        auto_resume=body.wants_auto_resume(),
        metadata=body.metadata or {},
        envs=body.env_vars or {},
        network=body.network_policy(),
        hooks=body.hooks or NO_HOOKS,
    )
    if from_snapshot:  # a snapshot id where a template goes: files and processes come along
        request = await snapshot_request(w, caller.name, body.template_id, request)
    if request.sandbox_id is not None:
        try:
            existing = await w.lifecycle.get(request.sandbox_id, owner=caller.name)
        except NotFound:
            existing = None
        if existing is not None and visible(existing):
            return sandbox_out(
                existing, w.settings, template_ids=await template_ids(w.builds, [existing])
            )
    spans.mark("template")
    await admit_create(w, caller.name)
    spans.mark("admit")
    try:
        record = await w.lifecycle.create(request, wait=w.settings.create_wait)
    except Conflict:
        if request.sandbox_id is None:
            raise
        # A concurrent retry with the same key won the race: answer with its sandbox.
        record = await w.lifecycle.get(request.sandbox_id, owner=caller.name)
    spans.mark("lifecycle")
    out = sandbox_out(record, w.settings, template_ids=await template_ids(w.builds, [record]))
    spans.mark("answer")
    log.info("create_route_timing", sandbox_id=record.sandbox_id, **spans.as_ms())
    return out


@router.get(
    "/sandboxes/{sandbox_id}",
    response_model=SandboxDetailOut,
    responses=_ERRORS,
    summary="Get a sandbox",
)
@router.get(
    "/v2/sandboxes/{sandbox_id}",
    response_model=SandboxDetailOut,
    responses=_ERRORS,
    include_in_schema=False,
)
async def get_sandbox(w: WiringDep, caller: CallerDep, sandbox_id: str) -> SandboxDetailOut:
    record = await _get(w, caller, sandbox_id)
    return detail_out(record, w.settings, await template_ids(w.builds, [record]))


def _parse_metadata(raw: str | None) -> dict[str, str]:
    """The SDK double-encodes: ``metadata=a%2520b=c`` → ``{"a b": "c"}`` (as the SDK's list
    call sends it; tests/api/test_e2b_routes.py)."""
    if not raw:
        return {}
    return {unquote(k): unquote(v) for k, v in parse_qsl(raw, keep_blank_values=True)}


async def _listed(w: WiringDep, caller: CallerDep) -> list[SandboxRecord]:
    return [r for r in await w.lifecycle.list(owner=caller.scope) if visible(r)]


@router.get(
    "/v2/sandboxes",
    response_model=list[ListedSandboxOut],
    responses=_ERRORS,
    summary="List sandboxes (filters, x-next-token pagination)",
)
async def list_sandboxes_v2(  # noqa: PLR0917 - one parameter per query field of the spec
    w: WiringDep,
    caller: CallerDep,
    response: Response,
    metadata: str | None = None,
    state: Annotated[str | None, Query(description="comma-separated: running,paused")] = None,
    order: Literal["asc", "desc"] = "desc",  # E2B's default: newest first
    started_after: Annotated[datetime | None, Query(alias="startedAfter")] = None,
    template: str | None = None,
    next_token: Annotated[str | None, Query(alias="nextToken")] = None,
    limit: Annotated[int | None, Query(ge=1, le=1000)] = None,
) -> list[ListedSandboxOut]:
    wanted_states = {s.strip() for s in (state or "").split(",") if s.strip()}
    if wanted_states - {"running", "paused"}:
        raise ApiError(400, "state must be a comma-separated list of running, paused")
    meta = _parse_metadata(metadata)
    listed = await _listed(w, caller)
    shown = await template_ids(w.builds, listed)
    records = [
        r
        for r in listed
        if (not wanted_states or r.state.e2b in wanted_states)
        and all(r.metadata.get(k) == v for k, v in meta.items())
        and (template is None or template in {r.template, shown_template(r, shown)})
        and (started_after is None or r.started_at >= started_after)  # E2B: at or after
    ]

    def key(r: SandboxRecord) -> tuple[str, str]:
        return (r.started_at.isoformat(), r.sandbox_id)

    records.sort(key=key, reverse=order == "desc")
    if next_token:
        cursor = token_cursor(next_token, valid=bool, error="invalid nextToken")
        records = [r for r in records if (key(r) < cursor if order == "desc" else key(r) > cursor)]
    page = cut_page(
        records, key, limit=limit, max_limit=w.settings.list_max_limit, response=response
    )
    return [listed_out(r, w.settings, shown) for r in page]


@router.get(
    "/sandboxes",
    response_model=list[ListedSandboxOut],
    responses=_ERRORS,
    summary="List running sandboxes (SDK < 2.52)",
)
async def list_sandboxes_v1(
    w: WiringDep, caller: CallerDep, metadata: str | None = None
) -> list[ListedSandboxOut]:
    meta = _parse_metadata(metadata)
    records = sorted(
        (
            r
            for r in await _listed(w, caller)
            if r.state.e2b == "running" and all(r.metadata.get(k) == v for k, v in meta.items())
        ),
        key=lambda r: (r.started_at, r.sandbox_id),
    )
    shown = await template_ids(w.builds, records)
    return [listed_out(r, w.settings, shown) for r in records]


@router.post(
    "/v2/sandboxes/{sandbox_id}/connect",
    response_model=SandboxOut,
    responses={200: {"model": SandboxOut}, 201: {"model": SandboxOut}, **_ERRORS},
    summary="Connect: extend a running sandbox's TTL, or resume a paused one (201)",
)
@router.post(
    "/sandboxes/{sandbox_id}/connect",
    response_model=SandboxOut,
    responses={200: {"model": SandboxOut}, 201: {"model": SandboxOut}, **_ERRORS},
    summary="Connect (SDK < 2.52)",
)
async def connect_sandbox(
    w: WiringDep,
    caller: CallerDep,
    sandbox_id: str,
    response: Response,
    body: ConnectSandbox | None = None,
) -> SandboxOut:
    record = await _get(w, caller, sandbox_id)
    timeout = _timeout(w, body.timeout if body else None, default=record.timeout)
    if states.is_up(record.state):
        record = await w.lifecycle.extend_timeout(sandbox_id, owner=caller.scope, timeout=timeout)
        response.status_code = status.HTTP_200_OK
        return sandbox_out(record, w.settings, template_ids=await template_ids(w.builds, [record]))
    resumed, out = await _resume(w, caller, record, timeout, memory=body.memory if body else None)
    response.status_code = status.HTTP_201_CREATED if resumed else status.HTTP_200_OK
    return out


@router.post(
    "/sandboxes/{sandbox_id}/resume",
    status_code=201,
    response_model=SandboxOut,
    responses=_ERRORS,
    summary="Resume a paused sandbox (SDK 2.0; 409 when it is running)",
)
async def resume_sandbox(
    w: WiringDep, caller: CallerDep, sandbox_id: str, body: ResumedSandbox | None = None
) -> SandboxOut:
    record = await _get(w, caller, sandbox_id)
    refuse_resume_if_up(record, sandbox_id)
    timeout = _timeout(w, body.timeout if body else None, default=record.timeout)
    auto_pause, memory = (body.auto_pause, body.memory) if body else (None, None)
    return (await _resume(w, caller, record, timeout, auto_pause=auto_pause, memory=memory))[1]


async def _resume(
    w: WiringDep,
    caller: CallerDep,
    record: SandboxRecord,
    timeout: int,
    *,
    auto_pause: bool | None = None,
    memory: bool | None = None,
) -> tuple[bool, SandboxOut]:
    """Resume (admitted by the caller's quota and rate first); whether it resumed, and the view."""
    spans = Spans()
    await admit_resume(w, record)
    spans.mark("admit")
    result = await w.lifecycle.resume(
        record.sandbox_id,
        owner=caller.scope,
        timeout=timeout,
        auto_pause=auto_pause,
        memory=memory,
        wait=w.settings.transition_wait,
    )
    spans.mark("lifecycle")
    out = sandbox_out(
        result.record,
        w.settings,
        resumed=result.resumed,
        template_ids=await template_ids(w.builds, [result.record]),
    )
    spans.mark("answer")
    log.info("resume_route_timing", sandbox_id=record.sandbox_id, **spans.as_ms())
    return result.resumed, out


@router.post(
    "/sandboxes/{sandbox_id}/pause",
    status_code=204,
    responses=_ERRORS,
    summary="Pause a sandbox (409 when it is already paused)",
)
async def pause_sandbox(
    w: WiringDep, caller: CallerDep, sandbox_id: str, body: PauseRequest | None = None
) -> Response:
    await _get(w, caller, sandbox_id)
    memory = body.memory if body is not None else False
    await w.lifecycle.pause(
        sandbox_id, owner=caller.scope, wait=w.settings.transition_wait, memory=memory
    )
    return Response(status_code=204)


@router.post(
    "/sandboxes/{sandbox_id}/timeout",
    status_code=204,
    responses=_ERRORS,
    summary="Set the inactivity timeout, counted from now",
)
async def set_sandbox_timeout(
    w: WiringDep, caller: CallerDep, sandbox_id: str, body: TimeoutRequest
) -> Response:
    await _get(w, caller, sandbox_id)
    # 0 is E2B's "expire now" (pause or kill by the usual rule), not "the default".
    timeout = 0 if body.timeout == 0 else _timeout(w, body.timeout)
    await w.lifecycle.set_timeout(sandbox_id, owner=caller.scope, timeout=timeout)
    return Response(status_code=204)


@router.post(
    "/sandboxes/{sandbox_id}/refreshes",
    status_code=204,
    responses=_ERRORS,
    summary="Keep a sandbox alive for `duration` more seconds (only extends)",
)
async def refresh_sandbox(
    w: WiringDep, caller: CallerDep, sandbox_id: str, body: RefreshRequest | None = None
) -> Response:
    record = await _get(w, caller, sandbox_id)
    duration = _timeout(w, body.duration if body else None, default=record.timeout)
    await w.lifecycle.extend_timeout(sandbox_id, owner=caller.scope, timeout=duration)
    return Response(status_code=204)


@router.put(
    "/sandboxes/{sandbox_id}/network",
    status_code=204,
    responses=_ERRORS,
    summary="Replace the egress rules (SDK update_network); applied live, kept across pauses",
)
async def update_network(
    w: WiringDep, caller: CallerDep, sandbox_id: str, body: NetworkUpdate
) -> Response:
    record = await _get(w, caller, sandbox_id)
    # allowPublicTraffic is not part of an update: it stays what the create said.
    policy = body.policy(allow_public_traffic=record.network.allow_public_traffic)
    await w.lifecycle.set_network(sandbox_id, owner=caller.scope, policy=policy)
    return Response(status_code=204)


@router.delete(
    "/sandboxes/{sandbox_id}",
    status_code=204,
    responses=_ERRORS,
    summary="Kill a sandbox (404 when it is gone)",
)
async def kill_sandbox(w: WiringDep, caller: CallerDep, sandbox_id: str) -> Response:
    await _get(w, caller, sandbox_id)
    await w.lifecycle.kill(sandbox_id, owner=caller.scope, wait=w.settings.transition_wait)
    return Response(status_code=204)
