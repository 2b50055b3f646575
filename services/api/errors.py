"""The one place where torpor errors become HTTP responses.

Every error body is JSON ``{"code": <int>, "message": "..."}``: the E2B SDK's generated parser
runs ``Error.from_dict`` on it (``e2b/api/client/models/error.py``) and crashes on anything
else. 5xx answers say ``Should-Retry: false`` except 503, so the SDK's transport does not
blindly repeat a create whose first attempt may still complete.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import TypeVar

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.api.schemas import ErrorBody
from shared.domain import states
from shared.domain.record import SandboxRecord
from shared.errors import (
    ConfigError,
    Conflict,
    EnvdError,
    EnvdUnavailable,
    IllegalTransition,
    InvalidInput,
    NotFound,
    PauseRefused,
    PodNotReady,
    QuotaExceeded,
    RuntimeFailure,
    SnapshotTooLarge,
    TorporError,
    Unavailable,
    Unsupported,
)

log = structlog.get_logger()

NATIVE_PREFIX = "/api/"
Responses = dict[int | str, dict[str, object]]
T = TypeVar("T")


class ApiError(Exception):
    """Raised by route code for a specific status and message."""

    def __init__(self, status: int, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def available(part: T | None, what: str) -> T:
    """A part this deployment may lack (snapshots, events, webhooks, usage, template builds):
    501 naming it (``what`` is the subject and its verb, "webhooks are") when it does."""
    if part is None:
        raise ApiError(501, f"{what} not available on this deployment")
    return part


def refuse_resume_if_up(record: SandboxRecord, name: str) -> None:
    """Resuming a sandbox that is running (or still being created) is a 409 (E2B's rule); a
    connect instead extends its timeout."""
    if states.is_up(record.state):
        raise ApiError(409, f"sandbox {name} is already running")


def error_responses(*statuses: int) -> Responses:
    """A route's documented errors (OpenAPI ``responses``): every one answers ``ErrorBody``,
    the one shape ``error_response`` writes."""
    return {status: {"model": ErrorBody} for status in statuses}


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    out = dict(headers or {})
    if status >= 500 and status != HTTPStatus.SERVICE_UNAVAILABLE:
        out.setdefault("Should-Retry", "false")
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=out)


def quota_response(exc: QuotaExceeded) -> JSONResponse:
    """429 with ``Retry-After``. The SDK retries a 429 by itself (waiting ``Retry-After``):
    worth it for a rate limit, pointless for a count quota, which says ``Should-Retry: false``."""
    headers = {"Retry-After": str(exc.retry_after)}
    if not exc.retryable:
        headers["Should-Retry"] = "false"
    return error_response(429, str(exc), headers)


def status_for(error: TorporError) -> int:
    """HTTP status of a torpor error (most specific class first)."""
    table: list[tuple[type[TorporError], int]] = [
        (InvalidInput, 400),
        (NotFound, 404),
        (IllegalTransition, 409),
        (SnapshotTooLarge, 409),
        (Conflict, 409),
        (QuotaExceeded, 429),
        (EnvdUnavailable, 503),
        (Unavailable, 503),
        (EnvdError, 502),
        (PodNotReady, 504),
        (RuntimeFailure, 500),
        (ConfigError, 500),
        (Unsupported, 501),
    ]
    for cls, status in table:
        if isinstance(error, cls):
            return status
    return 500


def _is_native(request: Request) -> bool:
    return request.url.path.startswith(NATIVE_PREFIX)


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.message, exc.headers)


async def _torpor_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TorporError)
    if isinstance(exc, QuotaExceeded):
        return quota_response(exc)
    if isinstance(exc, PauseRefused):  # the reason, in full: what the hook said
        body = {"code": 409, "message": str(exc), "hook": exc.hook}
        return JSONResponse(body, status_code=409)
    status = status_for(exc)
    if status >= 500:
        log.warning("request_failed", error=type(exc).__name__, reason=str(exc))
    return error_response(status, str(exc) or type(exc).__name__)


async def _timeout(_: Request, exc: Exception) -> JSONResponse:
    # A transition that did not finish in time: its command stays queued and will complete.
    return error_response(504, f"the operation is still in progress: {exc}")


async def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "request"
        problems.append(f"{where}: {err.get('msg', 'invalid')}")
    # The native API answers 422 (FastAPI's convention); E2B's spec says 400 for bad input.
    status = 422 if _is_native(request) else 400
    return error_response(status, "; ".join(problems) or "invalid request")


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    message = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
    return error_response(exc.status_code, message, dict(exc.headers or {}))


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled_error", error=type(exc).__name__, exc_info=exc)
    return error_response(500, "internal error")


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(TorporError, _torpor_error)
    app.add_exception_handler(TimeoutError, _timeout)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
