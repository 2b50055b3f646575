"""What the dashboard shows: records with the snapshot decoded, events, users. camelCase JSON."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from services.api.dashboard.events_feed import SandboxEvent
from services.api.views import record_fields
from shared.domain.record import SandboxRecord
from shared.models.snapshots import Snapshot


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True, alias_generator=to_camel, populate_by_name=True)


class ProcessRow(_Out):
    cmd: str
    args: list[str]
    cwd: str | None = None
    pid: int
    tag: str | None = None


class SnapshotView(_Out):
    id: str
    captured_time: str
    processes: list[ProcessRow]
    error: str | None = None  # the annotation could not be decoded


class SandboxView(_Out):
    name: str  # the native name (per user), else the id
    sandbox_id: str  # what the dashboard addresses a sandbox by
    owner: str
    template: str
    state: str
    generation: int
    timeout: int
    auto_pause: bool
    auto_resume: bool
    metadata: dict[str, str]
    created_at: datetime
    started_at: datetime
    deadline: datetime | None = None
    paused_at: datetime | None = None
    retain_until: datetime | None = None
    last_activity: datetime | None = None
    failure: str | None = None
    snapshot: SnapshotView | None = None


class EventView(_Out):
    seq: int | None = None
    fact: str
    sandbox_id: str
    at: datetime | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class UserView(_Out):
    name: str
    admin: bool
    pause_resume: bool  # the PAUSE_RESUME flag, evaluated for this user


class Me(_Out):
    user: str
    admin: bool
    pause_resume: bool
    live: bool  # whether live updates and history are available (the bus feed is connected)
    # The session's CSRF token, for X-CSRF-Token on writes (null when signed in by header).
    csrf_token: str | None = None


def snapshot_view(record: SandboxRecord) -> SnapshotView | None:
    ref = record.snapshot
    if ref is None:
        return None
    try:
        snap = Snapshot.decode(ref.annotation)
    except ValueError as e:  # binascii.Error and pydantic's ValidationError are ValueErrors
        return SnapshotView(
            id=ref.id, captured_time=ref.captured_at, processes=[], error=type(e).__name__
        )
    return SnapshotView(
        id=ref.id,
        captured_time=snap.captured_time,
        processes=[
            ProcessRow(
                cmd=p.config.cmd, args=list(p.config.args), cwd=p.config.cwd, pid=p.pid, tag=p.tag
            )
            for p in snap.processes
        ],
    )


def sandbox_view(record: SandboxRecord, *, last_activity: datetime | None) -> SandboxView:
    return SandboxView(
        **record_fields(record),
        generation=record.generation,
        last_activity=last_activity,
        snapshot=snapshot_view(record),
    )


def event_view(event: SandboxEvent) -> EventView:
    return EventView(
        seq=event.seq, fact=event.fact, sandbox_id=event.sandbox_id, at=event.at, data=event.data
    )
