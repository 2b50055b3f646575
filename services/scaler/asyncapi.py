"""``faststream docs gen services.scaler.asyncapi:app --factory``."""

from __future__ import annotations

from typing import Any

from faststream import FastStream

from services.scaler.handlers import build_router
from services.scaler.scaling import Scaler
from shared.bus.asyncapi import document


def app() -> FastStream:
    inert: Any = None
    router = build_router(Scaler(store=inert, runtime=inert, envd=inert, publisher=inert))
    return document(
        router,
        title="torpor scaler",
        description="Creates workloads, scales them between 0 and 1 replicas, replays snapshots "
        "on resume and deletes workloads on kill.",
    )
