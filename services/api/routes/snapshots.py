"""E2B's snapshots and fork (SDK 2.63): ``create_snapshot``, ``list_snapshots``,
``delete_snapshot`` (which the SDK sends as ``DELETE /templates/{id}``), a snapshot id as the
``templateID`` of a create, and ``fork(count)`` with one result per fork."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Response

from services.api.deps import CallerDep, Snapshots, Wiring, WiringDep
from services.api.errors import ApiError, available, error_responses, status_for
from services.api.paging import cut_page, token_cursor
from services.api.quotas import admit_create
from services.api.schemas import (
    ForkErrorOut,
    ForkRequest,
    ForkResultOut,
    SnapshotInfoOut,
    SnapshotRequest,
)
from services.api.views import sandbox_out
from shared.errors import TorporError
from shared.ids import is_valid_sandbox_id
from shared.lifecycle.snapshots import origin_of
from shared.models.lifecycle import NO_HOOKS
from shared.models.snapshot_records import SnapshotRecord, is_snapshot_id, looks_like_snapshot_id
from shared.ports.lifecycle import CreateRequest
from shared.redaction import redact_text

router = APIRouter(tags=["e2b snapshots"])

_ERRORS = error_responses(400, 401, 404, 409, 429, 500, 501, 503, 504)
FORK_DEFAULT_TIMEOUT = 15  # E2B's API default for forks (SandboxForkRequest)


def _service(w: Wiring) -> Snapshots:
    return available(w.snapshots, "snapshots are")


def _sandbox_id_or_404(sandbox_id: str) -> str:
    if not is_valid_sandbox_id(sandbox_id):
        raise ApiError(404, f"sandbox {sandbox_id} not found")
    return sandbox_id


def _info(snap: SnapshotRecord) -> SnapshotInfoOut:
    return SnapshotInfoOut(snapshot_id=snap.snapshot_id, names=snap.names)


@router.post(
    "/sandboxes/{sandbox_id}/snapshots",
    status_code=201,
    response_model=SnapshotInfoOut,
    responses=_ERRORS,
    summary="Store a snapshot of the sandbox (processes and files); it keeps running",
)
async def create_snapshot(
    w: WiringDep, caller: CallerDep, sandbox_id: str, body: SnapshotRequest | None = None
) -> SnapshotInfoOut:
    snaps = _service(w)
    snap = await snaps.take(
        _sandbox_id_or_404(sandbox_id),
        owner=caller.scope,
        name=body.name if body else None,
        files_only=bool(body and body.memory is False),
        wait=w.settings.transition_wait,
    )
    return _info(snap)


@router.get(
    "/snapshots",
    response_model=list[SnapshotInfoOut],
    responses=_ERRORS,
    summary="List your snapshots, newest first (sandboxID, name filters; x-next-token pages)",
)
async def list_snapshots(  # noqa: PLR0917 - one parameter per query field of the spec
    w: WiringDep,
    caller: CallerDep,
    response: Response,
    sandbox_id: Annotated[str | None, Query(alias="sandboxID", max_length=63)] = None,
    name: Annotated[str | None, Query(max_length=63)] = None,
    limit: Annotated[int | None, Query(ge=1, le=1000)] = None,
    next_token: Annotated[str | None, Query(alias="nextToken", max_length=512)] = None,
) -> list[SnapshotInfoOut]:
    snaps = _service(w)
    found = await snaps.list(owner=caller.scope, sandbox_id=sandbox_id, name=name)

    def key(s: SnapshotRecord) -> tuple[str, str]:
        return (s.created_at.isoformat(), s.snapshot_id)

    if next_token:
        cursor = token_cursor(next_token, valid=is_snapshot_id, error="nextToken: invalid")
        found = [s for s in found if key(s) < cursor]  # newest first: the rest is older
    page = cut_page(found, key, limit=limit, max_limit=w.settings.list_max_limit, response=response)
    return [_info(s) for s in page]


@router.delete(
    "/templates/{template_id}",
    status_code=204,
    responses=_ERRORS,
    summary="Delete a snapshot (E2B's SDK deletes snapshots as templates); 404 when unknown",
)
async def delete_snapshot(w: WiringDep, caller: CallerDep, template_id: str) -> Response:
    if not looks_like_snapshot_id(template_id):
        # A template users built (the operator's template files are never deleted here).
        from services.api.routes.templates import delete_template

        await delete_template(w, caller, template_id)
        return Response(status_code=204)
    await _service(w).delete(template_id, owner=caller.scope)
    return Response(status_code=204)


async def snapshot_request(
    w: Wiring, owner: str, snapshot_id: str, base: CreateRequest
) -> CreateRequest:
    """A create whose ``templateID`` is a snapshot id: the snapshot's template and envs (the
    request's envs on top), its files and processes, and its source's hooks unless the request
    declares hooks of its own (then those, whole: hooks are not merged one by one).
    ``NotFound`` unless it is the caller's."""
    snap = await _service(w).get(snapshot_id, owner=owner)
    return base.model_copy(
        update={
            "template": snap.template,
            "envs": {**snap.envs, **base.envs},
            "hooks": base.hooks if base.hooks != NO_HOOKS else snap.hooks,
            "origin_snapshot_id": snap.snapshot_id,
            "origin": origin_of(snap),
        }
    )


@router.post(
    "/sandboxes/{sandbox_id}/fork",
    status_code=201,
    response_model=list[ForkResultOut],
    response_model_exclude_none=True,  # each entry has either "sandbox" or "error", never null
    responses=_ERRORS,
    summary="Fork: snapshot the sandbox once (it keeps running) and start `count` sandboxes "
    "from it; one result per fork",
)
async def fork_sandbox(
    w: WiringDep, caller: CallerDep, sandbox_id: str, body: ForkRequest | None = None
) -> list[ForkResultOut]:
    snaps = _service(w)
    count = (body.count if body else None) or 1
    timeout = (body.timeout if body else None) or FORK_DEFAULT_TIMEOUT
    if timeout > w.settings.max_timeout:
        raise ApiError(400, f"timeout must be at most {w.settings.max_timeout} seconds")
    source = await w.lifecycle.get(_sandbox_id_or_404(sandbox_id), owner=caller.scope)
    snap = await snaps.take(
        sandbox_id, owner=caller.scope, internal=True, wait=w.settings.transition_wait
    )
    base = CreateRequest(
        owner=caller.name,
        template=snap.template,
        timeout=timeout,
        auto_pause=source.auto_pause,
        auto_resume=source.auto_resume,
        metadata=dict(source.metadata),
        envs=dict(snap.envs),
        network=snap.network,
        hooks=snap.hooks,  # a fork is the same workload: its prePause/postResume apply to it
        origin_snapshot_id=snap.snapshot_id,
        origin=origin_of(snap),
    )

    async def one() -> ForkResultOut:
        try:
            await admit_create(w, caller.name)
            record = await w.lifecycle.create(base, wait=w.settings.create_wait)
            return ForkResultOut(sandbox=sandbox_out(record, w.settings))
        except TorporError as e:
            return ForkResultOut(
                error=ForkErrorOut(code=status_for(e), message=redact_text(str(e)))
            )
        except TimeoutError as e:
            return ForkResultOut(error=ForkErrorOut(code=504, message=str(e)))

    try:
        return list(await asyncio.gather(*(one() for _ in range(count))))
    finally:
        # Every fork has its own copy of the files by now (or failed): the snapshot goes.
        await snaps.delete(snap.snapshot_id, owner=None)
