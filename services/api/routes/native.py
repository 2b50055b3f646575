"""torpor's native REST API (the seed's ``/api/v1/sandbox/pause|resume/{name}`` and the calls
around them). Always available, whatever ``PAUSE_RESUME`` says: the flag gates only auto-pause
on timeout. Shows the real state (``pausing``, ``resuming``…), the last snapshot and retention."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from services.api.deps import CallerDep, WiringDep, require_template
from services.api.errors import ApiError, error_responses, refuse_resume_if_up
from services.api.names import named, resolve
from services.api.quotas import admit_create, admit_resume
from services.api.schemas import NativeCreate, NativeList, NativeSandbox
from services.api.views import native_out
from shared.domain import states
from shared.errors import Conflict
from shared.ids import SANDBOX_ID_PATTERN, owned_sandbox_id
from shared.models.lifecycle import NO_HOOKS
from shared.ports.lifecycle import CreateRequest

router = APIRouter(prefix="/api/v1/sandbox", tags=["native"])

Name = Annotated[
    str,
    Path(
        pattern=SANDBOX_ID_PATTERN,
        max_length=63,
        description="The sandbox name (yours; names are per user), or its sandbox id",
    ),
]
_ERRORS = error_responses(400, 401, 404, 409, 422, 503, 504)


@router.post("", status_code=201, response_model=NativeSandbox, responses=_ERRORS)
async def create(w: WiringDep, caller: CallerDep, body: NativeCreate) -> NativeSandbox:
    """Create a sandbox and wait until it runs."""
    if body.timeout > w.settings.max_timeout:
        raise ApiError(422, f"timeout must be at most {w.settings.max_timeout} seconds")
    require_template(w, body.template, field="template")
    await admit_create(w, caller.name)
    try:
        record = await w.lifecycle.create(
            CreateRequest(
                owner=caller.name,
                sandbox_id=owned_sandbox_id(caller.name, body.name) if body.name else None,
                name=body.name,
                template=body.template,
                timeout=body.timeout,
                auto_pause=body.auto_pause,
                auto_resume=body.auto_resume,
                metadata=body.metadata,
                envs=body.envs,
                hooks=body.hooks or NO_HOOKS,
            ),
            wait=w.settings.create_wait,
        )
    except Conflict:
        # Only the caller's own sandbox can hold this id: nobody else's name is revealed.
        raise ApiError(409, f"you already have a sandbox named {body.name}") from None
    return native_out(record)


@router.get("", response_model=NativeList, responses=_ERRORS)
async def list_sandboxes(w: WiringDep, caller: CallerDep) -> NativeList:
    """Your sandboxes (an admin sees everyone's), in creation order."""
    records = [r for r in await w.lifecycle.list(owner=caller.scope) if states.exists(r.state)]
    records.sort(key=lambda r: (r.created_at, r.sandbox_id))
    return NativeList(sandboxes=[native_out(r) for r in records])


@router.get("/{name}", response_model=NativeSandbox, responses=_ERRORS)
async def get(w: WiringDep, caller: CallerDep, name: Name) -> NativeSandbox:
    """State, last snapshot (base64, as annotated on the ReplicaSet) and retention time."""
    record = await resolve(w, caller, name)
    if not states.exists(record.state):
        raise ApiError(404, f"sandbox {name} not found")
    return native_out(record)


@router.delete("/{name}", status_code=204, responses=_ERRORS)
async def delete(w: WiringDep, caller: CallerDep, name: Name) -> Response:
    """Kill the sandbox and delete its workload."""
    record = await resolve(w, caller, name)
    with named(record, name):
        await w.lifecycle.kill(
            record.sandbox_id, owner=caller.scope, wait=w.settings.transition_wait
        )
    return Response(status_code=204)


@router.post("/pause/{name}", response_model=NativeSandbox, responses=_ERRORS)
async def pause(w: WiringDep, caller: CallerDep, name: Name) -> NativeSandbox:
    """Snapshot the processes, then scale to zero. 409 when already paused."""
    record = await resolve(w, caller, name)
    with named(record, name):
        return native_out(
            await w.lifecycle.pause(
                record.sandbox_id, owner=caller.scope, wait=w.settings.transition_wait
            )
        )


@router.post("/resume/{name}", response_model=NativeSandbox, responses=_ERRORS)
async def resume(w: WiringDep, caller: CallerDep, name: Name) -> NativeSandbox:
    """Scale to one, wait for the pod, replay the snapshot. 409 when already running."""
    record = await resolve(w, caller, name)
    refuse_resume_if_up(record, name)
    await admit_resume(w, record)
    with named(record, name):
        result = await w.lifecycle.resume(
            record.sandbox_id, owner=caller.scope, wait=w.settings.transition_wait
        )
    return native_out(result.record)
