"""The envd port: what the snapshotter (List) and the scaler (Start) need from a sandbox daemon,
and ``EnvdTelemetry``: what the API needs (its metrics and log).

The adapter is ``shared.envd.client.ConnectEnvdClient``. Errors: ``EnvdUnavailable`` when the
daemon cannot be reached (connection refused, timeout), ``EnvdError`` for a Connect error reply.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from shared.models.snapshots import ProcessConfig, SnapshotProcess
from shared.models.telemetry import LogEntry, MetricSample
from shared.ports.workloads import Endpoint


class CommandResult(BaseModel):
    """How a command run to its end went (``run_command``)."""

    model_config = ConfigDict(frozen=True)

    exit_code: int | None  # None: it did not end by itself (killed at its deadline)
    output: str = ""  # the tail of stdout and stderr, interleaved as they came
    timed_out: bool = False


class InnerActivity(BaseModel):
    """When the sandbox was last active by each signal, as the daemon saw it (``now``: its clock
    when it answered, so ages need no shared clock). ``None``: not since the daemon started."""

    model_config = ConfigDict(frozen=True)

    now: datetime
    last: dict[str, datetime | None]


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

    async def run_command(
        self,
        endpoint: Endpoint,
        command: str,
        *,
        user: str,
        timeout: float,
        access_token: str | None,
        envs: dict[str, str] | None = None,
    ) -> CommandResult:
        """Run ``/bin/bash -l -c command`` as ``user`` to its end; the daemon kills it at
        ``timeout`` seconds (``timed_out``). ``EnvdUnavailable``/``EnvdError``: it did not run."""
        ...

    async def activity(
        self, endpoint: Endpoint, *, access_token: str | None, timeout: float = 2.0
    ) -> InnerActivity:
        """``GET /activity``: the last time of each inside signal."""
        ...

    async def health(self, endpoint: Endpoint, *, timeout: float = 2.0) -> bool:
        """``True`` when ``GET /health`` answers 2xx."""
        ...

    async def close(self) -> None: ...


class EnvdTelemetry(Protocol):
    async def metrics(
        self,
        endpoint: Endpoint,
        *,
        access_token: str | None,
        start: int | None,
        end: int | None,
        timeout: float = 5.0,
    ) -> list[MetricSample]:
        """The daemon's samples with ``start <= timestamp_unix <= end`` (unix seconds)."""
        ...

    async def logs(
        self,
        endpoint: Endpoint,
        *,
        access_token: str | None,
        cursor_ms: int | None,
        limit: int,
        backward: bool,
        level: str | None,
        search: str | None,
        timeout: float = 5.0,
    ) -> list[LogEntry]:
        """The daemon's log entries from ``cursor_ms`` on (or back), at ``level`` or above."""
        ...
