"""Listings in pages (E2B's ``x-next-token``): the cursor token, base64 of ``<time>|<id>``, the
sort key of a page's last item, and the cut of one page. Used by ``GET /v2/sandboxes`` and
``GET /snapshots``."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import TypeVar

from fastapi import Response

from services.api.errors import ApiError

T = TypeVar("T")


def page_token(key: tuple[str, str]) -> str:
    """The token of an item whose sort key is ``(time in ISO 8601, id)``."""
    at, item_id = key
    return base64.urlsafe_b64encode(f"{at}|{item_id}".encode()).decode()


def token_cursor(token: str, *, valid: Callable[[str], bool], error: str) -> tuple[str, str]:
    """``(time, id)`` of a ``page_token``; a 400 saying ``error`` when it is not one or its id is
    not ``valid``."""
    try:
        at, _, item_id = base64.urlsafe_b64decode(token.encode()).decode().partition("|")
    except (binascii.Error, UnicodeDecodeError, ValueError) as e:
        raise ApiError(400, error) from e
    if not valid(item_id):
        raise ApiError(400, error)
    return at, item_id


def cut_page(
    items: list[T],
    key: Callable[[T], tuple[str, str]],
    *,
    limit: int | None,
    max_limit: int,
    response: Response,
) -> list[T]:
    """The first ``limit`` items (at most ``max_limit``); when more follow, ``x-next-token`` is
    set to the ``page_token`` of the last one's sort ``key``."""
    page_size = min(limit or max_limit, max_limit)
    page, rest = items[:page_size], items[page_size:]
    if rest and page:
        response.headers["x-next-token"] = page_token(key(page[-1]))
    return page
