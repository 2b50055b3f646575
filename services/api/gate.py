"""The API's front door, before any route (and before FastAPI reads a body):

- at most ``HttpLimits.max_requests_per_client`` requests in progress per client (429);
- a request with a body must carry a valid API key (401 without reading a byte of it), except
  the dashboard's own routes, which get a small cap instead;
- the body must fit ``ApiSettings.max_body_bytes`` (413, from Content-Length before reading, or
  while reading a chunked body), arrive without a pause longer than
  ``HttpLimits.body_idle_timeout`` and in full within ``ApiSettings.body_timeout`` (408).

The body is read here, bounded, and replayed to the app; the authenticated user is left on the
scope so the route's dependency does not look the key up again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.settings import ApiSettings
from services.api.uploads import UPLOAD_PREFIX, UploadSigner
from shared.auth.models import User
from shared.web.limits import HttpLimits
from shared.web.requests import (
    BodyReader,
    InFlight,
    RequestRefused,
    check_declared,
    has_body,
    send_refusal,
)

AUTHENTICATED = "torpor.authenticated"  # scope key: (secret, User)
DASHBOARD_PREFIX = "/dashboard/"
DASHBOARD_MAX_BODY = 16 * 1024  # a sign-in form; the dashboard's other writes have no body


def header_secret(scope: Scope) -> str | None:
    """The API key of ``X-API-KEY`` or ``Authorization: Bearer``, as the routes read it."""
    bearer: str | None = None
    for name, value in scope.get("headers", []):
        if name == b"x-api-key" and value.strip():
            return str(value.decode("latin-1")).strip()
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                bearer = token.strip()
    return bearer


class ApiGate:
    def __init__(
        self,
        app: ASGIApp,
        *,
        settings: ApiSettings,
        limits: HttpLimits,
        wiring: Callable[[], Any],
    ) -> None:
        self.app = app
        self.settings = settings
        self.limits = limits
        self.wiring = wiring
        self.in_flight = InFlight(limits.max_requests_per_client)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            with self.in_flight.hold(scope):
                if has_body(scope):
                    receive = await self._admit_body(scope, receive)
                await self.app(scope, receive, send)
        except RequestRefused as refused:
            await send_refusal(send, refused)

    async def _admit_body(self, scope: Scope, receive: Receive) -> Receive:
        limit = self.settings.max_body_bytes
        if scope["path"].startswith(DASHBOARD_PREFIX):
            limit = DASHBOARD_MAX_BODY
        elif scope["path"].startswith(UPLOAD_PREFIX) and scope.get("method") == "PUT":
            # A template's build context: the signed URL is the credential (no API key, as
            # with E2B's presigned URLs); checked before a byte of the body is read.
            limit = self._admit_upload(scope)
        else:
            await self._authenticate(scope)
        check_declared(scope, limit)
        reader = BodyReader(
            receive,
            limit=limit,
            idle=self.limits.body_idle_timeout,
            total=self.settings.body_timeout,
        )
        body, gone = await reader.read_all()
        return _replay(body, gone, receive)

    def _admit_upload(self, scope: Scope) -> int:
        wired = self.wiring()
        builds = getattr(wired, "builds", None) if wired is not None else None
        if builds is None:
            raise RequestRefused(503, "template builds are not available")
        token = scope["path"][len(UPLOAD_PREFIX) :]
        if "/" in token or UploadSigner(builds.signer_key).verify(token) is None:
            raise RequestRefused(403, "the upload URL is invalid or has expired")
        return int(builds.max_upload_bytes)

    async def _authenticate(self, scope: Scope) -> None:
        wired = self.wiring()
        if wired is None:
            raise RequestRefused(503, "the API is starting")
        secret = header_secret(scope)
        if not secret:
            raise RequestRefused(401, "missing API key: send X-API-KEY or Authorization: Bearer")
        user: User | None = await wired.keys.authenticate(secret)
        if user is None:
            raise RequestRefused(401, "invalid API key")
        scope[AUTHENTICATED] = (secret, user)


def _replay(body: bytes, gone: bool, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            if gone:
                return {"type": "http.disconnect"}
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
