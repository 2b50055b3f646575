"""``faststream docs gen services.ledger.asyncapi:app --factory``."""

from __future__ import annotations

from typing import Any

from faststream import FastStream

from services.ledger.handlers import build_router
from services.ledger.metering import Ledger
from shared.bus.asyncapi import document


def app() -> FastStream:
    inert: Any = None
    router = build_router(Ledger(records=inert, usage=inert, sizes=inert))
    return document(
        router,
        title="torpor ledger",
        description="The usage ledger: running seconds x size and paused seconds x kept bytes, "
        "resumes and replay failures per sandbox, from the lifecycle events, exactly once "
        "(KV torpor_usage, docs/usage.md).",
    )
