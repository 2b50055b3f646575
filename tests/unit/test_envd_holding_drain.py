"""An export with a hold whose writes in flight never end (``services.envd.archive``): refused
with 409 after the bound, nothing frozen, and the sandbox not left held."""

from __future__ import annotations

import json
from typing import Any

from services.envd.archive import KeptFilesApi
from services.envd.freezing import Freezer
from services.envd.holding import WritesInFlight


class _NeverFreezes(Freezer):
    def freeze(self) -> int:
        raise AssertionError("an export refused for writes in flight froze the sandbox")


async def test_writes_that_do_not_end_refuse_the_export() -> None:
    writes = WritesInFlight()
    api = KeptFilesApi(
        kept_root="/nonexistent",
        user=lambda: None,
        freezer=_NeverFreezes(),
        writes=writes,
        drain_seconds=0.05,
    )
    writes.begin()  # an upload that never finishes
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "method": "GET", "path": "/kept-files", "query_string": b"hold=60"}
    await api(scope, receive, send)
    assert sent[0]["status"] == 409
    body = json.loads(sent[1]["body"])
    assert "1 writes through the API did not end in time" in body["message"]
    assert not api.holding  # refused: new writes pass again
    writes.end()
    assert await writes.drained(0.05)
