"""E2B's sandbox metrics and logs: read from the sandbox's daemon (its ``/metrics`` and ``/logs``)
through the envd telemetry port. A sandbox that is not running has no daemon: its metrics and
logs are empty, never an error. Included before the E2B router: ``/sandboxes/metrics`` must not be
taken for the sandbox called "metrics"."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

import structlog
from fastapi import APIRouter, Query

from services.api.deps import CallerDep, WiringDep
from services.api.errors import ApiError
from services.api.routes.e2b import _ERRORS, _get
from services.api.schemas import (
    MetricOut,
    SandboxesWithMetricsOut,
    SandboxLogEntryOut,
    SandboxLogLineOut,
    SandboxLogsOut,
    SandboxLogsV2Out,
)
from shared.domain import states
from shared.domain.record import SandboxRecord
from shared.errors import EnvdError, NotFound, Unavailable
from shared.ids import is_valid_sandbox_id
from shared.models.telemetry import LogEntry, MetricSample
from shared.ports.workloads import Endpoint

router = APIRouter(tags=["e2b"])
log = structlog.get_logger()

MAX_UNIX_SECONDS = 2**40  # beyond any real timestamp; bounds what reaches the daemon
MAX_SANDBOX_IDS = 100  # E2B's maxItems
MAX_LOG_LIMIT = 1000
Seconds = Annotated[int | None, Query(ge=0, le=MAX_UNIX_SECONDS)]
Millis = Annotated[int | None, Query(ge=0, le=MAX_UNIX_SECONDS * 1000)]


def _endpoint(record: SandboxRecord) -> Endpoint | None:
    if not states.is_running(record.state) or not record.host:
        return None
    return Endpoint(host=record.host, pod_uid=record.pod_uid or "")


def _metric(sample: MetricSample) -> MetricOut:
    return MetricOut(
        timestamp=datetime.fromtimestamp(sample.timestamp_unix, UTC),
        timestamp_unix=sample.timestamp_unix,
        cpu_count=sample.cpu_count,
        cpu_used_pct=sample.cpu_used_pct,
        mem_used=sample.mem_used,
        mem_total=sample.mem_total,
        disk_used=sample.disk_used,
        disk_total=sample.disk_total,
    )


async def _samples(
    w: WiringDep, record: SandboxRecord, start: int | None, end: int | None
) -> list[MetricSample]:
    endpoint = _endpoint(record)
    if endpoint is None or w.telemetry is None or (start and end and start > end):
        return []
    try:
        return await w.telemetry.metrics(
            endpoint, access_token=record.envd_access_token, start=start, end=end
        )
    except (Unavailable, EnvdError) as exc:  # pausing, or a pod between restarts
        log.info("metrics_unavailable", sandbox_id=record.sandbox_id, reason=str(exc))
        return []


@router.get(
    "/sandboxes/metrics",
    response_model=SandboxesWithMetricsOut,
    responses=_ERRORS,
    summary="The latest metrics of each given running sandbox of yours",
)
async def sandboxes_metrics(
    w: WiringDep,
    caller: CallerDep,
    sandbox_ids: Annotated[str, Query(max_length=MAX_SANDBOX_IDS * 64)],
) -> SandboxesWithMetricsOut:
    ids = [i.strip() for i in sandbox_ids.split(",") if i.strip()]
    if not ids:
        raise ApiError(400, "sandbox_ids: at least one sandbox id is required")
    if len(ids) > MAX_SANDBOX_IDS:
        raise ApiError(400, f"sandbox_ids: at most {MAX_SANDBOX_IDS} ids")
    if len(set(ids)) != len(ids):
        raise ApiError(400, "sandbox_ids: ids must be unique")
    out: dict[str, MetricOut] = {}
    for sandbox_id in ids:
        if not is_valid_sandbox_id(sandbox_id):
            raise ApiError(400, "sandbox_ids: not a sandbox id")
        try:  # another tenant's sandbox is not found, like a missing one: simply absent
            record = await _get(w, caller, sandbox_id)
        except (NotFound, ApiError):
            continue
        samples = await _samples(w, record, None, None)
        if samples:
            out[sandbox_id] = _metric(samples[-1])
    return SandboxesWithMetricsOut(sandboxes=out)


@router.get(
    "/sandboxes/{sandbox_id}/metrics",
    response_model=list[MetricOut],
    responses=_ERRORS,
    summary="Sandbox metrics, 5-second samples (empty unless running)",
)
async def sandbox_metrics(
    w: WiringDep,
    caller: CallerDep,
    sandbox_id: str,
    start: Seconds = None,
    end: Seconds = None,
) -> list[MetricOut]:
    record = await _get(w, caller, sandbox_id)
    return [_metric(s) for s in await _samples(w, record, start, end)]


async def _entries(
    w: WiringDep,
    record: SandboxRecord,
    *,
    cursor_ms: int | None,
    limit: int,
    backward: bool = False,
    level: str | None = None,
    search: str | None = None,
) -> list[LogEntry]:
    endpoint = _endpoint(record)
    if endpoint is None or w.telemetry is None or limit == 0:
        return []
    try:
        return await w.telemetry.logs(
            endpoint,
            access_token=record.envd_access_token,
            cursor_ms=cursor_ms,
            limit=limit,
            backward=backward,
            level=level,
            search=search,
        )
    except (Unavailable, EnvdError) as exc:
        log.info("logs_unavailable", sandbox_id=record.sandbox_id, reason=str(exc))
        return []


def _entry(e: LogEntry) -> SandboxLogEntryOut:
    level = e.level if e.level in ("debug", "info", "warn", "error") else "info"
    return SandboxLogEntryOut(
        timestamp=e.timestamp, level=level, message=e.message, fields=e.fields
    )


@router.get(
    "/sandboxes/{sandbox_id}/logs",
    response_model=SandboxLogsOut,
    responses=_ERRORS,
    summary="Sandbox logs: the daemon's log (empty unless running)",
)
async def sandbox_logs(
    w: WiringDep,
    caller: CallerDep,
    sandbox_id: str,
    start: Millis = None,
    limit: Annotated[int, Query(ge=0, le=MAX_LOG_LIMIT)] = MAX_LOG_LIMIT,
) -> SandboxLogsOut:
    record = await _get(w, caller, sandbox_id)
    entries = await _entries(w, record, cursor_ms=start, limit=limit)
    return SandboxLogsOut(
        logs=[SandboxLogLineOut(timestamp=e.timestamp, line=e.message) for e in entries],
        log_entries=[_entry(e) for e in entries],
    )


@router.get(
    "/v2/sandboxes/{sandbox_id}/logs",
    response_model=SandboxLogsV2Out,
    responses=_ERRORS,
    summary="Sandbox logs (v2): cursor, direction, level and search",
)
async def sandbox_logs_v2(  # noqa: PLR0917 - one parameter per query field of the spec
    w: WiringDep,
    caller: CallerDep,
    sandbox_id: str,
    cursor: Millis = None,
    limit: Annotated[int, Query(ge=0, le=MAX_LOG_LIMIT)] = MAX_LOG_LIMIT,
    direction: Literal["forward", "backward"] = "forward",
    level: Literal["debug", "info", "warn", "error"] | None = None,
    search: Annotated[str | None, Query(max_length=256)] = None,
) -> SandboxLogsV2Out:
    record = await _get(w, caller, sandbox_id)
    entries = await _entries(
        w,
        record,
        cursor_ms=cursor,
        limit=limit,
        backward=direction == "backward",
        level=level,
        search=search,
    )
    return SandboxLogsV2Out(logs=[_entry(e) for e in entries])
