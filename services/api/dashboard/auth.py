"""Dashboard sign-in: the API key goes into an HttpOnly, SameSite=Strict cookie (never into
JavaScript-readable storage, a URL or a log line). Requests may also authenticate with the
API's usual headers. Cookie-authenticated writes must carry ``X-Torpor-Dashboard: 1``: a header a
cross-site form cannot send, so a forged request is refused even where SameSite is not honoured."""

from __future__ import annotations

from typing import Annotated

import structlog
from fastapi import Depends, Request, Response

from services.api.deps import Caller, WiringDep
from services.api.errors import ApiError

COOKIE = "torpor_dashboard"
CSRF_HEADER = "x-torpor-dashboard"
SESSION_SECONDS = 12 * 3600
_MAX_KEY_LEN = 256


def _header_secret(request: Request) -> str | None:
    if key := request.headers.get("x-api-key"):
        return key
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token:
        return token
    return None


async def authenticate(w: WiringDep, secret: str) -> Caller:
    secret = secret.strip()
    if not secret or len(secret) > _MAX_KEY_LEN:
        raise ApiError(401, "invalid API key")
    user = await w.keys.authenticate(secret)
    if user is None:
        raise ApiError(401, "invalid API key")
    structlog.contextvars.bind_contextvars(user=user.name)
    return Caller(user)


async def dashboard_caller(request: Request, w: WiringDep) -> Caller:
    if (secret := _header_secret(request)) is not None:
        return await authenticate(w, secret)
    if (cookie := request.cookies.get(COOKIE)) is not None:
        return await authenticate(w, cookie)
    raise ApiError(401, "not signed in")


async def dashboard_writer(request: Request, w: WiringDep) -> Caller:
    """As ``dashboard_caller``, plus the anti-CSRF header when the cookie is the credential."""
    if _header_secret(request) is None and request.headers.get(CSRF_HEADER) != "1":
        raise ApiError(403, f"missing {CSRF_HEADER} header")
    return await dashboard_caller(request, w)


def set_session(request: Request, response: Response, secret: str) -> None:
    response.set_cookie(
        COOKIE,
        secret,
        max_age=SESSION_SECONDS,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def clear_session(response: Response) -> None:
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")


ReaderDep = Annotated[Caller, Depends(dashboard_caller)]
WriterDep = Annotated[Caller, Depends(dashboard_writer)]
