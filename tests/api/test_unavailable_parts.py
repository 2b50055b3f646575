"""A deployment without a part (snapshots, events, webhooks, usage, template builds) answers
its routes with 501 and a JSON body naming the part, never a 500 or an empty answer."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import auth


@pytest.mark.parametrize(
    ("path", "part"),
    [
        ("/snapshots", "snapshots are"),
        ("/events/sandboxes", "the events API is"),
        ("/events/webhooks", "webhooks are"),
        ("/api/v1/usage", "the usage ledger is"),
        ("/templates", "template builds are"),
    ],
)
async def test_a_missing_part_is_a_501_naming_it(
    client: httpx.AsyncClient, path: str, part: str
) -> None:
    response = await client.get(path, headers=auth())
    assert response.status_code == 501, response.text
    assert response.json() == {
        "code": 501,
        "message": f"{part} not available on this deployment",
    }
