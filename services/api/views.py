"""Records to wire shapes (E2B and native), in one place."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from services.api.schemas import (
    HookOutcomeOut,
    LifecycleOut,
    ListedSandboxOut,
    NativeSandbox,
    NetworkOut,
    ResumeReportOut,
    SandboxDetailOut,
    SandboxOut,
    SnapshotOut,
)
from services.api.settings import ENVD_VERSION, ApiSettings
from shared.auth.traffic import traffic_token
from shared.domain import states
from shared.domain.record import SandboxRecord
from shared.domain.timing import deadline_after
from shared.models.messages import ResumeReport


def visible(record: SandboxRecord) -> bool:
    """Gone or going sandboxes are hidden from every view (E2B kill answers 404 from then on)."""
    return states.is_visible(record.state)


def e2b_metadata(record: SandboxRecord) -> dict[str, str]:
    """User metadata plus ``snapshot`` (base64) once the sandbox has been paused."""
    out = dict(record.metadata)
    if record.snapshot is not None:
        out["snapshot"] = record.snapshot.annotation
    return out


def end_at(record: SandboxRecord) -> datetime:
    if record.deadline is not None:
        return record.deadline
    if record.retain_until is not None:
        return record.retain_until
    return deadline_after(record.started_at, record.timeout)


def report_out(report: ResumeReport | None) -> ResumeReportOut | None:
    if report is None:
        return None
    return ResumeReportOut.model_validate(report.model_dump())  # same field names


def sandbox_out(
    record: SandboxRecord,
    settings: ApiSettings,
    *,
    resumed: bool = False,
    template_ids: Mapping[str, str] | None = None,
) -> SandboxOut:
    """``resumed``: this call resumed the sandbox, so the answer carries the resume report.
    ``template_ids``: build id -> template id (``services.api.template_builds.template_ids``)."""
    return SandboxOut(
        resume_report=report_out(record.last_resume) if resumed else None,
        template_id=shown_template(record, template_ids),
        sandbox_id=record.sandbox_id,
        client_id=settings.client_id,
        envd_version=ENVD_VERSION,
        envd_access_token=record.envd_access_token,
        traffic_access_token=traffic_token_of(record),
        domain=settings.sandbox_domain,
    )


def traffic_token_of(record: SandboxRecord) -> str | None:
    """Only sandboxes whose user ports are not public need one (E2B returns null otherwise)."""
    if record.network.allow_public_traffic:
        return None
    return traffic_token(record.sandbox_id, record.envd_access_token)


def network_out(record: SandboxRecord) -> NetworkOut:
    return NetworkOut(
        allow_out=list(record.network.allow_out),
        deny_out=list(record.network.deny_out),
        allow_public_traffic=record.network.allow_public_traffic,
    )


def shown_template(record: SandboxRecord, template_ids: Mapping[str, str] | None) -> str:
    return (template_ids or {}).get(record.template, record.template)


def listed_out(
    record: SandboxRecord, settings: ApiSettings, template_ids: Mapping[str, str] | None = None
) -> ListedSandboxOut:
    return ListedSandboxOut(
        template_id=shown_template(record, template_ids),
        sandbox_id=record.sandbox_id,
        client_id=settings.client_id,
        started_at=record.started_at,
        end_at=end_at(record),
        cpu_count=settings.cpu_count,
        memory_mb=settings.memory_mb,
        disk_size_mb=settings.disk_size_mb,
        metadata=e2b_metadata(record),
        state=record.state.e2b,
        envd_version=ENVD_VERSION,
    )


def detail_out(
    record: SandboxRecord, settings: ApiSettings, template_ids: Mapping[str, str] | None = None
) -> SandboxDetailOut:
    listed = listed_out(record, settings, template_ids)
    return SandboxDetailOut(
        **listed.model_dump(),
        envd_access_token=record.envd_access_token,
        domain=settings.sandbox_domain,
        allow_internet_access=record.network.allow_internet,
        network=network_out(record),
        lifecycle=LifecycleOut(
            auto_resume=record.auto_resume,
            on_timeout="pause" if record.auto_pause else "kill",
        ),
    )


def record_fields(record: SandboxRecord) -> dict[str, Any]:
    """The name (else the id), the real state and the record's own fields, as both the native
    API (``native_out``) and the dashboard (``dashboard.views.sandbox_view``) show them: keyword
    arguments of both models (which validate them)."""
    return {
        "name": record.name or record.sandbox_id,
        "sandbox_id": record.sandbox_id,
        "owner": record.owner,
        "template": record.template,
        "state": record.state.value,
        "timeout": record.timeout,
        "auto_pause": record.auto_pause,
        "auto_resume": record.auto_resume,
        "metadata": dict(record.metadata),
        "created_at": record.created_at,
        "started_at": record.started_at,
        "deadline": record.deadline,
        "paused_at": record.paused_at,
        "retain_until": record.retain_until,
        "failure": record.failure,
    }


def native_out(record: SandboxRecord) -> NativeSandbox:
    snap = record.snapshot
    return NativeSandbox(
        **record_fields(record),
        snapshot=(
            SnapshotOut(
                annotation=snap.annotation,
                captured_at=snap.captured_at,
                process_count=snap.process_count,
            )
            if snap is not None
            else None
        ),
        envd_access_token=record.envd_access_token,
        last_resume=report_out(record.last_resume),
        hooks=record.hooks or None,
        refused_pause=(
            HookOutcomeOut.model_validate(record.refused_pause.model_dump())
            if record.refused_pause is not None
            else None
        ),
    )
