"""The operator dashboard (``/dashboard``) and the event-history call the CLI uses
(``GET /api/v1/sandbox/{name}/events``).

Reads go through the ``Lifecycle`` port with the caller's scope (an admin sees everyone), exactly
as the native API does; live updates and history come from an ``EventSource`` over the bus,
opened in this router's lifespan. Without a bus (unit tests with fakes) the dashboard still
lists and acts, and live updates / history answer 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from importlib import resources
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs

import structlog
from fastapi import APIRouter, FastAPI, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from services.api.dashboard.auth import (
    COOKIE,
    LOGIN_COOKIE,
    ReaderDep,
    WriterDep,
    authenticate,
    check_csrf,
    clear_session,
    current_session,
    sessions_of,
    set_login_csrf,
    set_session,
)
from services.api.dashboard.ports import EventSource
from services.api.dashboard.views import (
    EventView,
    Me,
    SandboxView,
    UserView,
    event_view,
    sandbox_view,
)
from services.api.deps import Caller, CallerDep, Wiring, WiringDep
from services.api.errors import ApiError, available, refuse_resume_if_up
from services.api.names import named, resolve
from services.api.quotas import admit_resume
from services.api.routes.usage import UsageOut, usage_of
from services.api.sessions import new_token
from shared.auth.keys import hash_secret
from shared.domain import states
from shared.domain.record import SandboxRecord
from shared.domain.states import SandboxState
from shared.errors import NotFound, TorporError, Unavailable
from shared.ids import SANDBOX_ID_PATTERN, owned_sandbox_id
from shared.settings import BusSettings, FeatureFlags, load

log = structlog.get_logger()

STATIC_FILES = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
# No inline script or style, nothing from elsewhere: the page can only talk to this API.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# An event stream ends after this long and the browser reconnects (and re-reads the list): it
# keeps a shutting-down server from waiting on streams that would never end by themselves.
STREAM_SECONDS = 30.0
KEEPALIVE_SECONDS = 10.0

Name = Annotated[str, Path(pattern=SANDBOX_ID_PATTERN, max_length=63)]
OwnerFilter = Annotated[str | None, Query(max_length=63, description="admins: one user only")]


def _static(name: str) -> bytes:
    return (resources.files("services.api.dashboard") / "static" / name).read_bytes()


def _feed(request: Request) -> EventSource | None:
    return getattr(request.app.state, "dashboard_feed", None)


def _need_feed(request: Request) -> EventSource:
    feed = _feed(request)
    if feed is None:
        raise ApiError(503, "live events are not available (no bus connection)")
    return feed


async def _may_see(feed: EventSource, caller: Caller, name: str) -> None:
    """404 unless the sandbox exists (killed tombstones included) and is the caller's."""
    owner = await feed.owner_of(name)
    if owner is None or (caller.scope is not None and owner != caller.scope):
        raise ApiError(404, f"sandbox {name} not found")


async def _views(records: list[SandboxRecord], feed: EventSource | None) -> list[SandboxView]:
    if feed is None:
        return [sandbox_view(r, last_activity=None) for r in records]
    activity = await asyncio.gather(*(feed.last_activity(r.sandbox_id) for r in records))
    return [sandbox_view(r, last_activity=a) for r, a in zip(records, activity, strict=True)]


def _sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'), default=str)}\n\n"


def dashboard_router(
    *,
    bus: BusSettings | None,
    flags: FeatureFlags | None = None,
    feed: EventSource | None = None,
) -> APIRouter:
    """The router the api app includes. ``feed`` overrides the bus connection (tests)."""
    flags = flags if flags is not None else load(FeatureFlags)
    page = _static("index.html")
    assets = {name: _static(name) for name in STATIC_FILES}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            opened: EventSource | None = feed
            if opened is None and bus is not None:
                from services.api.dashboard.events_feed import EventsFeed

                try:
                    opened = await stack.enter_async_context(EventsFeed.open(bus))
                except Unavailable as e:
                    log.warning("dashboard_live_updates_off", reason=str(e))
            app.state.dashboard_feed = opened
            yield

    router = APIRouter(lifespan=lifespan)
    hidden: dict[str, Any] = {"include_in_schema": False}

    # ---- page and assets -------------------------------------------------------------------

    @router.get("/dashboard", **hidden)
    async def index() -> Response:
        return Response(page, media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)

    @router.get("/dashboard/static/{name}", **hidden)
    async def asset(name: str) -> Response:
        if name not in assets:
            raise ApiError(404, "no such file")
        return Response(assets[name], media_type=STATIC_FILES[name], headers=PAGE_HEADERS)

    # ---- session ---------------------------------------------------------------------------

    def me(caller: Caller, request: Request, csrf: str | None = None) -> Me:
        if csrf is None:
            session = getattr(request.state, "dashboard_session", None)
            csrf = session.csrf if session is not None else None
        return Me(
            user=caller.name,
            admin=caller.user.admin,
            pause_resume=flags.pause_resume_enabled_for(caller.name),
            live=_feed(request) is not None,
            csrf_token=csrf,
        )

    @router.get("/dashboard/api/csrf", tags=["dashboard"])
    async def login_csrf(request: Request, response: Response, w: WiringDep) -> dict[str, str]:
        """A sign-in CSRF token: send it back as ``X-CSRF-Token`` with ``/dashboard/login``."""
        token = new_token()
        set_login_csrf(request, response, w, token)
        response.headers["Cache-Control"] = "no-store"
        return {"csrfToken": token}

    @router.post("/dashboard/login", response_model=Me, tags=["dashboard"])
    async def login(request: Request, response: Response, w: WiringDep) -> Me:
        """Sign in with an API key (JSON ``{"apiKey": "..."}`` or a form field ``apiKey``)."""
        secret: Any = None
        if request.headers.get("content-type", "").startswith("application/json"):
            with contextlib.suppress(ValueError):
                body = await request.json()
                secret = body.get("apiKey") if isinstance(body, dict) else None
        else:  # a plain urlencoded form post
            fields = parse_qs((await request.body()).decode("utf-8", "replace"))
            values = fields.get("apiKey")
            secret = values[0] if values else None
        if not isinstance(secret, str):
            raise ApiError(400, "send the API key as apiKey")
        # Login CSRF: the token from GET /dashboard/api/csrf, as header and (HttpOnly) cookie.
        check_csrf(request, request.cookies.get(LOGIN_COOKIE) or "")
        caller = await authenticate(w, secret)
        sessions = sessions_of(request, w)
        if old := request.cookies.get(COOKIE):
            await sessions.close(old)  # a fresh id at every sign-in (no session fixation)
        session_id, session = await sessions.open(caller.name, hash_secret(secret.strip()))
        set_session(request, response, w, session_id)
        log.info("dashboard_login")  # the user is bound by authenticate; never the key
        return me(caller, request, session.csrf)

    @router.post("/dashboard/logout", status_code=204, tags=["dashboard"])
    async def logout(request: Request, w: WiringDep) -> Response:
        """End the session (CSRF-checked); without a live session, just drop the cookie."""
        found = await current_session(request, w)
        if found is not None:
            check_csrf(request, found[1].csrf)
            await sessions_of(request, w).close(request.cookies.get(COOKIE, ""))
        response = Response(status_code=204)
        clear_session(request, response, w)
        return response

    @router.get("/dashboard/api/me", response_model=Me, tags=["dashboard"])
    async def whoami(caller: ReaderDep, request: Request) -> Me:
        return me(caller, request)

    # ---- sandboxes -------------------------------------------------------------------------

    @router.get("/dashboard/api/sandboxes", response_model=list[SandboxView], tags=["dashboard"])
    async def sandboxes(
        caller: ReaderDep, w: WiringDep, request: Request, owner: OwnerFilter = None
    ) -> list[SandboxView]:
        scope = caller.scope if caller.scope is not None else owner
        records = [r for r in await w.lifecycle.list(owner=scope) if states.exists(r.state)]
        records.sort(key=lambda r: (r.created_at, r.sandbox_id))
        return await _views(records, _feed(request))

    @router.get("/dashboard/api/sandboxes/{name}", response_model=SandboxView, tags=["dashboard"])
    async def sandbox(caller: ReaderDep, w: WiringDep, request: Request, name: Name) -> SandboxView:
        record = await resolve(w, caller, name)
        return (await _views([record], _feed(request)))[0]

    @router.post(
        "/dashboard/api/sandboxes/{name}/{action}", response_model=SandboxView, tags=["dashboard"]
    )
    async def act(
        caller: WriterDep,
        w: WiringDep,
        request: Request,
        name: Name,
        action: Literal["pause", "resume", "kill"],
    ) -> SandboxView:
        """Pause, resume or kill; answers when the transition is done (504 if still going)."""
        found = await resolve(w, caller, name)
        with named(found, name):
            record = await _act(w, caller, found.sandbox_id, action)
        return (await _views([record], _feed(request)))[0]

    @router.get(
        "/dashboard/api/sandboxes/{name}/events", response_model=list[EventView], tags=["dashboard"]
    )
    async def dashboard_events(caller: ReaderDep, request: Request, name: Name) -> list[EventView]:
        feed = _need_feed(request)
        return await _history(feed, caller, await _event_key(feed, caller, name))

    @router.get("/dashboard/api/usage", response_model=UsageOut, tags=["dashboard"])
    async def dashboard_usage(
        caller: ReaderDep, w: WiringDep, owner: OwnerFilter = None
    ) -> UsageOut:
        """The usage panel: the signed-in user's (admins: the owner filter's, else their own)."""
        usage = available(w.usage, "the usage ledger is")
        name = owner if (caller.user.admin and owner) else caller.name
        return await usage_of(usage, name)

    @router.get("/dashboard/api/users", response_model=list[UserView], tags=["dashboard"])
    async def users(caller: ReaderDep, w: WiringDep, request: Request) -> list[UserView]:
        """Admins: every user (and every sandbox owner) with their PAUSE_RESUME status."""
        if not caller.user.admin:
            raise ApiError(403, "only admins can list users")
        known: dict[str, bool] = {}
        feed = _feed(request)
        if feed is not None:
            known = {u.name: u.admin for u in await feed.users()}
        for record in await w.lifecycle.list(owner=None):
            known.setdefault(record.owner, False)
        return [
            UserView(name=n, admin=a, pause_resume=flags.pause_resume_enabled_for(n))
            for n, a in sorted(known.items())
        ]

    @router.get("/dashboard/api/stream", tags=["dashboard"])
    async def stream(caller: ReaderDep, request: Request, owner: OwnerFilter = None) -> Response:
        """Server-sent events: ``sandbox`` (one bus event, of the caller's sandboxes only),
        ``lagged`` (events were dropped: re-read the list), ``hello`` on connect."""
        feed = _need_feed(request)
        scope = caller.scope if caller.scope is not None else owner
        return StreamingResponse(
            _event_stream(feed, scope),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    # ---- native API: event history (``torpor sandbox logs``) --------------------------------

    @router.get(
        "/api/v1/sandbox/{name}/events",
        response_model=dict[str, list[EventView]],
        tags=["native"],
        summary="Event history of a sandbox (also after it was killed, while its record lasts)",
    )
    async def native_events(
        caller: CallerDep,
        request: Request,
        name: Name,
        limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    ) -> dict[str, list[EventView]]:
        feed = _need_feed(request)
        sid = await _event_key(feed, caller, name)
        return {"events": await _history(feed, caller, sid, limit=limit)}

    return router


async def _act(w: Wiring, caller: Caller, name: str, action: str) -> SandboxRecord:
    wait = w.settings.transition_wait
    if action == "pause":
        return await w.lifecycle.pause(name, owner=caller.scope, wait=wait)
    if action == "resume":
        current = await w.lifecycle.get(name, owner=caller.scope)
        refuse_resume_if_up(current, name)
        await admit_resume(w, current)
        return (await w.lifecycle.resume(name, owner=caller.scope, wait=wait)).record
    current = await w.lifecycle.get(name, owner=caller.scope)
    await w.lifecycle.kill(name, owner=caller.scope, wait=wait)
    return current.model_copy(update={"state": SandboxState.KILLED, "deadline": None})


async def _event_key(feed: EventSource, caller: Caller, name: str) -> str:
    """The sandbox id whose events ``name`` means: the caller's sandbox of that name (killed ones
    too, while their record lasts), else ``name`` taken as an id."""
    own = owned_sandbox_id(caller.name, name)
    return own if await feed.owner_of(own) == caller.name else name


async def _history(
    feed: EventSource, caller: Caller, name: str, *, limit: int = 200
) -> list[EventView]:
    await _may_see(feed, caller, name)
    return [event_view(e) for e in await feed.history(name, limit=limit)]


async def _event_stream(feed: EventSource, scope: str | None) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    yield "retry: 1000\n\n"
    async with feed.listen() as listener:
        yield _sse("hello", {"streamSeconds": STREAM_SECONDS})
        ends = loop.time() + STREAM_SECONDS
        while (left := ends - loop.time()) > 0:
            try:
                event = await asyncio.wait_for(listener.queue.get(), min(left, KEEPALIVE_SECONDS))
            except TimeoutError:
                yield ": keepalive\n\n"
                continue
            if listener.lagged:
                listener.lagged = False
                yield _sse("lagged", {})
            try:
                owner = await feed.owner_of(event.sandbox_id)
            except (NotFound, TorporError):
                continue
            if owner is None or (scope is not None and owner != scope):
                continue
            view = event_view(event).model_dump(mode="json", by_alias=True)
            yield _sse("sandbox", {**view, "owner": owner})
