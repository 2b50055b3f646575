"""E2B's webhook management (``/events/webhooks``) plus the delivery history torpor keeps.

``POST`` answers the webhook with its ``signatureSecret``: the only time it is shown. Webhooks
are the caller's own (admins' too): another user's webhook id is 404. Bodies refuse unknown
fields (400 naming them). Delivery, signatures and the address rules: docs/webhooks.md.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from services.api.deps import CallerDep, WebhookAdmin, Wiring, WiringDep
from services.api.errors import available, error_responses
from shared.lifecycle.webhooks import Changes
from shared.models.webhooks import DeliveryRecord, Webhook

router = APIRouter(prefix="/events/webhooks", tags=["e2b webhooks"])

_ERRORS = error_responses(400, 401, 404, 409, 501, 503)
WebhookId = Annotated[str, Path(max_length=64, description="The webhook's id (wh-…)")]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WebhookCreate(_Body):
    name: str = Field(default="", max_length=128)
    url: str = Field(max_length=4096)
    events: list[str] = Field(max_length=64)
    enabled: bool = True
    signature_secret: str | None = Field(default=None, alias="signatureSecret", max_length=1024)


class WebhookUpdate(_Body):
    name: str | None = Field(default=None, max_length=128)
    url: str | None = Field(default=None, max_length=4096)
    events: list[str] | None = Field(default=None, max_length=64)
    enabled: bool | None = None
    signature_secret: str | None = Field(default=None, alias="signatureSecret", max_length=1024)


class WebhookOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    id: str
    team_id: str = Field(alias="teamId")
    name: str
    url: str
    events: list[str]
    enabled: bool
    created_at: datetime = Field(alias="createdAt")
    updated_at: datetime = Field(alias="updatedAt")


class WebhookCreatedOut(WebhookOut):
    signature_secret: str = Field(
        alias="signatureSecret",
        description="HMAC-SHA256 key of the deliveries' signatures: shown only now",
    )


def _out(hook: Webhook) -> WebhookOut:
    return WebhookOut(
        id=hook.id,
        team_id=hook.owner,
        name=hook.name,
        url=hook.url,
        events=list(hook.events),
        enabled=hook.enabled,
        created_at=hook.created_at,
        updated_at=hook.updated_at,
    )


def _registry(w: Wiring) -> WebhookAdmin:
    return available(w.webhooks, "webhooks are")


@router.post(
    "",
    status_code=201,
    response_model=WebhookCreatedOut,
    response_model_by_alias=True,
    responses=_ERRORS,
    summary="Register a webhook (its signing secret is in this answer only)",
)
async def create_webhook(w: WiringDep, caller: CallerDep, body: WebhookCreate) -> WebhookCreatedOut:
    hook = await _registry(w).create(
        caller.name,
        url=body.url,
        events=body.events,
        name=body.name,
        enabled=body.enabled,
        secret=body.signature_secret,
    )
    return WebhookCreatedOut(**_out(hook).model_dump(), signature_secret=hook.secret)


@router.get(
    "",
    response_model=list[WebhookOut],
    response_model_by_alias=True,
    responses=_ERRORS,
    summary="Your webhooks",
)
async def list_webhooks(w: WiringDep, caller: CallerDep) -> list[WebhookOut]:
    return [_out(h) for h in await _registry(w).owned(caller.name)]


@router.get(
    "/{webhook_id}",
    response_model=WebhookOut,
    response_model_by_alias=True,
    responses=_ERRORS,
    summary="One of your webhooks",
)
async def get_webhook(w: WiringDep, caller: CallerDep, webhook_id: WebhookId) -> WebhookOut:
    return _out(await _registry(w).get(caller.name, webhook_id))


@router.patch(
    "/{webhook_id}",
    response_model=WebhookOut,
    response_model_by_alias=True,
    responses=_ERRORS,
    summary="Change a webhook (the fields given)",
)
async def update_webhook(
    w: WiringDep, caller: CallerDep, webhook_id: WebhookId, body: WebhookUpdate
) -> WebhookOut:
    hook = await _registry(w).update(
        caller.name,
        webhook_id,
        Changes(
            name=body.name,
            url=body.url,
            events=body.events,
            enabled=body.enabled,
            secret=body.signature_secret,
        ),
    )
    return _out(hook)


@router.delete("/{webhook_id}", status_code=204, responses=_ERRORS, summary="Unregister a webhook")
async def delete_webhook(w: WiringDep, caller: CallerDep, webhook_id: WebhookId) -> Response:
    await _registry(w).delete(caller.name, webhook_id)
    return Response(status_code=204)


@router.get(
    "/{webhook_id}/deliveries",
    response_model=list[DeliveryRecord],
    response_model_by_alias=True,
    responses=_ERRORS,
    summary="The webhook's deliveries (newest first): state, attempts, last status or error",
)
async def webhook_deliveries(
    w: WiringDep,
    caller: CallerDep,
    webhook_id: WebhookId,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[DeliveryRecord]:
    return await _registry(w).deliveries(caller.name, webhook_id, limit=limit)
