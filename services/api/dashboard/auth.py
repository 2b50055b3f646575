"""Dashboard sign-in and CSRF.

The cookie holds a random session id (``sessions.py``), HttpOnly, SameSite=Strict, and Secure
when the request came over HTTPS (directly, or per a trusted proxy's X-Forwarded-Proto; see
``TORPOR_HTTP_TRUSTED_PROXIES``) or when ``TORPOR_COOKIE_SECURE=true``. The API key never goes
into a cookie, JavaScript-readable storage, a URL or a log line. Requests may also authenticate
with the API's usual headers (then no cookie and no CSRF token are involved).

CSRF: every cookie-authenticated write (actions, sign-out) must send ``X-CSRF-Token`` equal to
its session's token (given to the page by sign-in and ``/dashboard/api/me``, which another site
cannot read). Sign-in itself needs a pre-session token: ``GET /dashboard/api/csrf`` returns one
and sets it as an HttpOnly cookie; the sign-in must send it back as ``X-CSRF-Token``. A cross-site
form can neither read the token nor set the header."""

from __future__ import annotations

from typing import Annotated

import structlog
from fastapi import Depends, Request, Response

from services.api.deps import Caller, Wiring, WiringDep
from services.api.errors import ApiError
from services.api.sessions import SESSION_SECONDS, MemoryBucket, Session, Sessions, same

COOKIE = "torpor_dashboard"
LOGIN_COOKIE = "torpor_login_csrf"
CSRF_HEADER = "x-csrf-token"
LOGIN_CSRF_SECONDS = 3600
_MAX_KEY_LEN = 256


def _header_secret(request: Request) -> str | None:
    if key := request.headers.get("x-api-key"):
        return key
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token:
        return token
    return None


def sessions_of(request: Request, w: Wiring) -> Sessions:
    if w.sessions is not None:
        return w.sessions
    fallback: Sessions | None = getattr(request.app.state, "dashboard_sessions", None)
    if fallback is None:
        fallback = request.app.state.dashboard_sessions = Sessions(MemoryBucket())
    return fallback


async def authenticate(w: WiringDep, secret: str) -> Caller:
    secret = secret.strip()
    if not secret or len(secret) > _MAX_KEY_LEN:
        raise ApiError(401, "invalid API key")
    user = await w.keys.authenticate(secret)
    if user is None:
        raise ApiError(401, "invalid API key")
    structlog.contextvars.bind_contextvars(user=user.name)
    return Caller(user)


async def current_session(request: Request, w: Wiring) -> tuple[Caller, Session] | None:
    """The signed-in user and session of the cookie; ``None`` if there is none (any more)."""
    session_id = request.cookies.get(COOKIE)
    if not session_id:
        return None
    sessions = sessions_of(request, w)
    session = await sessions.get(session_id)
    if session is None:
        return None
    user = await w.keys.user_for_digest(session.key_digest)
    if user is None:  # the key was revoked (or its user removed): the session ends with it
        await sessions.close(session_id)
        return None
    structlog.contextvars.bind_contextvars(user=user.name)
    return Caller(user), session


async def dashboard_caller(request: Request, w: WiringDep) -> Caller:
    if (secret := _header_secret(request)) is not None:
        return await authenticate(w, secret)
    found = await current_session(request, w)
    if found is None:
        raise ApiError(401, "not signed in")
    request.state.dashboard_session = found[1]
    return found[0]


def check_csrf(request: Request, expected: str) -> None:
    sent = request.headers.get(CSRF_HEADER) or ""
    if not sent or not same(sent, expected):
        raise ApiError(403, "missing or wrong X-CSRF-Token header")


async def dashboard_writer(request: Request, w: WiringDep) -> Caller:
    """As ``dashboard_caller``, plus the session's CSRF token when the cookie is the credential."""
    caller = await dashboard_caller(request, w)
    session: Session | None = getattr(request.state, "dashboard_session", None)
    if session is not None:
        check_csrf(request, session.csrf)
    return caller


def cookie_secure(request: Request, w: Wiring) -> bool:
    return w.settings.cookie_secure or request.url.scheme == "https"


def _set_cookie(
    request: Request,
    response: Response,
    w: Wiring,
    name: str,
    value: str,
    *,
    max_age: int,
    path: str,
) -> None:
    # Every dashboard cookie: out of scripts' reach, never sent cross-site, https-only over https.
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=path,
        httponly=True,
        samesite="strict",
        secure=cookie_secure(request, w),
    )


def set_login_csrf(request: Request, response: Response, w: Wiring, token: str) -> None:
    _set_cookie(
        request, response, w, LOGIN_COOKIE, token, max_age=LOGIN_CSRF_SECONDS, path="/dashboard"
    )


def set_session(request: Request, response: Response, w: Wiring, session_id: str) -> None:
    _set_cookie(request, response, w, COOKIE, session_id, max_age=SESSION_SECONDS, path="/")
    response.delete_cookie(LOGIN_COOKIE, path="/dashboard", httponly=True, samesite="strict")


def clear_session(request: Request, response: Response, w: Wiring) -> None:
    response.delete_cookie(
        COOKIE, path="/", httponly=True, samesite="strict", secure=cookie_secure(request, w)
    )


ReaderDep = Annotated[Caller, Depends(dashboard_caller)]
WriterDep = Annotated[Caller, Depends(dashboard_writer)]
