"""Settings shared by the local runtime's tests and the owner subprocess they start."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from shared.runtime.local import LocalRuntime

TEMPLATES: Path | None = None  # the packaged templates: sandbox-base runs the real daemon

LocalRuntimeFactory = Callable[..., Awaitable[LocalRuntime]]


def runtime_kwargs(nats_url: str, data_dir: Path, bucket: str) -> dict[str, Any]:
    return {
        "nats_url": nats_url,
        "data_dir": data_dir,
        "bucket": bucket,
        "templates_dir": TEMPLATES,
        "stop_grace": 1.0,
        "poll_interval": 0.2,
    }
