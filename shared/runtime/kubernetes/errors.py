"""Kubernetes client errors → torpor's own (``shared.errors``), at the adapter boundary."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
from kubernetes.aio.client.exceptions import ApiException

from shared.errors import Conflict, NotFound, RuntimeFailure, TorporError


def _reason(e: ApiException) -> str:
    try:
        body = json.loads(e.body or "")
        return str(body.get("message") or e.reason)
    except (ValueError, AttributeError):
        return str(e.reason)


def translate(e: BaseException, what: str) -> TorporError:
    """404 → ``NotFound``, 409 → ``Conflict``, anything else → ``RuntimeFailure``."""
    if isinstance(e, ApiException):
        reason = _reason(e)
        if e.status == 404:
            return NotFound(f"{what}: not found ({reason})")
        if e.status == 409:
            return Conflict(f"{what}: conflict ({reason})")
        return RuntimeFailure(f"{what}: kubernetes API answered {e.status}: {reason}")
    if isinstance(e, aiohttp.ClientError | TimeoutError | OSError):
        return RuntimeFailure(f"{what}: kubernetes API unreachable: {e!r}")
    return RuntimeFailure(f"{what}: {e!r}")


@contextmanager
def api_errors(what: str) -> Iterator[None]:
    """Re-raise client errors as torpor errors; torpor's own pass through unchanged."""
    try:
        yield
    except TorporError:
        raise
    except (TimeoutError, ApiException, aiohttp.ClientError, OSError) as e:
        raise translate(e, what) from e


def status_of(e: BaseException) -> int | None:
    return e.status if isinstance(e, ApiException) else None
