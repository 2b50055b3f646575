"""The usage ledger over HTTP: ``GET /api/v1/usage`` (your totals and each sandbox's) and
``GET /api/v1/usage/sandboxes/{id}``. Figures include the interval still open now (a running
sandbox's seconds grow between two reads); docs/usage.md says how they are computed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from services.api.deps import CallerDep, Wiring, WiringDep
from services.api.errors import ApiError, available, error_responses
from shared.auth.models import check_user_name
from shared.errors import InvalidInput
from shared.ids import SANDBOX_ID_PATTERN
from shared.models.usage import Meters, SandboxUsage, UsageTotals, meters_of, totals
from shared.ports.usage import UsageStore

router = APIRouter(prefix="/api/v1/usage", tags=["usage"])

_ERRORS = error_responses(400, 401, 403, 404, 422, 501, 503)


class SandboxUsageOut(Meters):
    sandbox_id: str = Field(alias="sandboxId")
    owner: str
    template: str
    state: str
    cpu_count: float = Field(alias="cpuCount")
    memory_mb: int = Field(alias="memoryMB")
    kept_bytes: int = Field(alias="keptBytes")


class UsageOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    user: str
    as_of: datetime = Field(alias="asOf")
    totals: UsageTotals
    sandboxes: list[SandboxUsageOut]


def sandbox_out(u: SandboxUsage) -> SandboxUsageOut:
    return SandboxUsageOut(
        sandbox_id=u.sandbox_id,
        owner=u.owner,
        template=u.template,
        state=u.state,
        cpu_count=u.size.cpu,
        memory_mb=u.size.memory_mb,
        kept_bytes=u.size.kept_bytes,
        **meters_of(u),
    )


def _store(w: Wiring) -> UsageStore:
    return available(w.usage, "the usage ledger is")


async def usage_of(store: UsageStore, user: str) -> UsageOut:
    """``user``'s usage as of now (the open intervals included)."""
    now = datetime.now(UTC)
    usages = sorted((u.as_of(now) for u in await store.of_owner(user)), key=lambda u: u.sandbox_id)
    return UsageOut(
        user=user, as_of=now, totals=totals(usages), sandboxes=[sandbox_out(u) for u in usages]
    )


@router.get(
    "",
    response_model=UsageOut,
    response_model_by_alias=True,
    responses=_ERRORS,
    summary="Your usage: totals and per sandbox (admins: ?user=)",
)
async def my_usage(
    w: WiringDep,
    caller: CallerDep,
    user: Annotated[str | None, Query(max_length=63, description="Admins: another user")] = None,
) -> UsageOut:
    name = caller.name
    if user is not None and user != caller.name:
        if not caller.user.admin:
            raise ApiError(403, "user: only admins can read another user's usage")
        try:
            name = check_user_name(user)
        except (InvalidInput, ValueError) as e:
            raise ApiError(422, f"user: {e}") from None
    return await usage_of(_store(w), name)


@router.get(
    "/sandboxes/{sandbox_id}",
    response_model=SandboxUsageOut,
    response_model_by_alias=True,
    responses=_ERRORS,
    summary="One sandbox's usage",
)
async def sandbox_usage(
    w: WiringDep,
    caller: CallerDep,
    sandbox_id: Annotated[str, Path(pattern=SANDBOX_ID_PATTERN, max_length=63)],
) -> SandboxUsageOut:
    store = _store(w)
    found = await store.get_with_revision(caller.name, sandbox_id)
    usage = found[0] if found else None
    if usage is None and caller.user.admin:
        usage = next((u for u in await store.everyone() if u.sandbox_id == sandbox_id), None)
    if usage is None:
        raise ApiError(404, f"no usage recorded for sandbox {sandbox_id}")
    return sandbox_out(usage.as_of(datetime.now(UTC)))
