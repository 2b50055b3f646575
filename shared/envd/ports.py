"""The envd port: what the snapshotter (List) and the scaler (Start) need from a sandbox daemon.

The adapter is ``shared.envd.client.ConnectEnvdClient``. Errors: ``EnvdUnavailable`` when the
daemon cannot be reached (connection refused, timeout), ``EnvdError`` for a Connect error reply.
"""

from __future__ import annotations

from typing import Protocol

from shared.models.snapshots import ProcessConfig, SnapshotProcess
from shared.runtime.models import Endpoint


class Envd(Protocol):
    async def list_processes(
        self, endpoint: Endpoint, *, access_token: str | None, timeout: float = 10.0
    ) -> list[SnapshotProcess]:
        """Every live process the daemon manages, in start order (oldest first)."""
        ...

    async def start_process(
        self,
        endpoint: Endpoint,
        config: ProcessConfig,
        *,
        tag: str | None,
        access_token: str | None,
        timeout: float = 10.0,
    ) -> int:
        """Start a background process (no deadline) and return its pid once the daemon reports
        the start event."""
        ...

    async def health(self, endpoint: Endpoint, *, timeout: float = 2.0) -> bool:
        """``True`` when ``GET /health`` answers 2xx."""
        ...

    async def close(self) -> None: ...
