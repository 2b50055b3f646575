"""E2B's lifecycle events API: ``GET /events/sandboxes/{id}`` (one sandbox) and
``GET /events/sandboxes`` (every sandbox of the caller), read from the event stream.

E2B's parameters (``offset``, ``limit`` 1-100 default 10, ``orderAsc`` default false, ``types``
repeated) plus ``since``/``until`` (RFC 3339) to bound the window. Another user's sandbox is 404;
admins see every sandbox's events.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from services.api.deps import CallerDep, EventReader, Wiring, WiringDep
from services.api.errors import ApiError, available, error_responses
from shared.ids import SANDBOX_ID_PATTERN
from shared.lifecycle.event_query import Page
from shared.models.public_events import PublicEvent

router = APIRouter(prefix="/events/sandboxes", tags=["e2b events"])

_ERRORS = error_responses(400, 401, 404, 501, 503)

Offset = Annotated[int, Query(ge=0, le=100_000, description="Events to skip")]
Limit = Annotated[int, Query(ge=1, le=100, description="Events to return")]
OrderAsc = Annotated[bool, Query(alias="orderAsc", description="Oldest first")]
Types = Annotated[
    list[str] | None,
    Query(max_length=16, description="Event types (repeat for several): sandbox.lifecycle.*"),
]
Since = Annotated[datetime | None, Query(description="Events at or after this time (RFC 3339)")]
Until = Annotated[datetime | None, Query(description="Events at or before this time (RFC 3339)")]


def _reader(w: Wiring) -> EventReader:
    return available(w.events, "the events API is")


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _page(
    *,
    offset: Offset = 0,
    limit: Limit = 10,
    order_asc: OrderAsc = False,
    types: Types = None,
    since: Since = None,
    until: Until = None,
) -> Page:
    """The page both routes read, from E2B's query parameters (a dependency)."""
    since, until = _utc(since), _utc(until)
    if since is not None and until is not None and until < since:
        raise ApiError(400, "until: must not be before since")
    return Page(
        offset=offset,
        limit=limit,
        order="asc" if order_asc else "desc",
        types=tuple(types or ()),
        since=since,
        until=until,
    )


EventPage = Annotated[Page, Depends(_page)]


@router.get(
    "",
    response_model=list[PublicEvent],
    response_model_by_alias=True,
    responses=_ERRORS,
    summary="Lifecycle events of all your sandboxes (newest first unless orderAsc)",
)
async def list_events(w: WiringDep, caller: CallerDep, page: EventPage) -> list[PublicEvent]:
    return await _reader(w).of_owner(caller.scope, page=page)


@router.get(
    "/{sandbox_id}",
    response_model=list[PublicEvent],
    response_model_by_alias=True,
    responses=_ERRORS,
    summary="Lifecycle events of one sandbox (newest first unless orderAsc)",
)
async def sandbox_events(
    w: WiringDep,
    caller: CallerDep,
    sandbox_id: Annotated[str, Path(pattern=SANDBOX_ID_PATTERN, max_length=63)],
    page: EventPage,
) -> list[PublicEvent]:
    return await _reader(w).of_sandbox(sandbox_id, owner=caller.scope, page=page)
