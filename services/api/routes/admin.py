"""Per-user quotas over the native API: ``GET`` (admins, or the user for themself) and ``PUT``
(admins) ``/api/v1/users/{name}/quota``. The defaults are ``TORPOR_QUOTA_*``; an override sets
some limits for one user (``null`` keeps a default; ``{}`` clears the override)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict

from services.api.deps import CallerDep, UserAdmin, WiringDep
from services.api.errors import ApiError, error_responses
from shared.auth.models import check_user_name
from shared.models.quota import Quota, QuotaOverride

router = APIRouter(prefix="/api/v1/users", tags=["admin"])

UserName = Annotated[str, Path(min_length=1, max_length=63, description="A user name")]
_ERRORS = error_responses(400, 401, 403, 404, 413, 422, 429, 503)


class UserQuota(BaseModel):
    model_config = ConfigDict(frozen=True)

    user: str
    quota: Quota  # what applies now
    override: QuotaOverride | None  # the user's own limits, if any


def _users(w: WiringDep) -> UserAdmin:
    if w.users is None or w.quota is None:
        raise ApiError(503, "quotas are not available (no bus connection)")
    return w.users


def _name(name: str) -> str:
    try:
        return check_user_name(name)
    except ValueError as e:
        raise ApiError(422, f"name: {e}") from None


async def _view(w: WiringDep, name: str) -> UserQuota:
    users = _users(w)
    user = await users.get(name)
    if user is None or w.quota is None:
        raise ApiError(404, f"no user {name}")
    return UserQuota(user=name, quota=await w.quota.quota_of(name), override=user.quota)


@router.get(
    "/{name}/quota",
    response_model=UserQuota,
    response_model_by_alias=True,
    responses=_ERRORS,
    summary="A user's effective quota and override (admins; or yourself)",
)
async def get_quota(w: WiringDep, caller: CallerDep, name: UserName) -> UserQuota:
    name = _name(name)
    if not caller.user.admin and caller.name != name:
        raise ApiError(403, "only admins can read other users' quotas")
    return await _view(w, name)


@router.put(
    "/{name}/quota",
    response_model=UserQuota,
    response_model_by_alias=True,
    responses=_ERRORS,
    summary="Set a user's quota override (admins)",
)
async def put_quota(
    w: WiringDep, caller: CallerDep, name: UserName, body: QuotaOverride
) -> UserQuota:
    name = _name(name)
    if not caller.user.admin:
        raise ApiError(403, "only admins can set quotas")
    users = _users(w)
    if await users.get(name) is None:
        raise ApiError(404, f"no user {name}")
    await users.set_quota(name, body)
    return await _view(w, name)
