"""Webhooks: the registration (KV ``torpor_webhooks``), the delivery job on the bus
(``webhook.delivery.<webhook id>``) and the delivery history (KV ``torpor_webhook_deliveries``).

Keys are ``<owner token>.<webhook id>``: a user's webhooks are one key prefix (listing them is
one filtered read) and the token, a hash of the user name, is one safe KV token whatever the
name holds (a ``.`` in a user name would otherwise split it).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import string
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

WEBHOOK_ID_PATTERN = r"^wh-[a-z0-9]{20}$"
_WEBHOOK_ID = re.compile(WEBHOOK_ID_PATTERN)
_ALPHABET = string.ascii_lowercase + string.digits


def new_webhook_id() -> str:
    return "wh-" + "".join(secrets.choice(_ALPHABET) for _ in range(20))


def is_webhook_id(value: str) -> bool:
    return bool(_WEBHOOK_ID.match(value))


def owner_token(owner: str) -> str:
    return hashlib.sha256(owner.encode()).hexdigest()[:32]


def webhook_key(owner: str, webhook_id: str) -> str:
    return f"{owner_token(owner)}.{webhook_id}"


def delivery_key(webhook_id: str, event_id: str) -> str:
    """One history entry per (webhook, event): every attempt updates it."""
    return f"{webhook_id}.{hashlib.sha256(event_id.encode()).hexdigest()[:32]}"


class Webhook(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str
    owner: str
    name: str
    url: str
    events: tuple[str, ...]
    enabled: bool = True
    secret: str  # never shown after creation, never logged
    created_at: datetime
    updated_at: datetime

    def wants(self, event_type: str) -> bool:
        return self.enabled and event_type in self.events


class DeliveryJob(BaseModel):
    """One event for one webhook. ``body`` is the exact JSON document sent (and signed) on every
    attempt; the message id ``<webhook id>:<event id>`` makes the fan-out idempotent."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    schema_version: Literal[1] = 1
    webhook_id: str = Field(pattern=WEBHOOK_ID_PATTERN)
    owner: str
    event_id: str
    event_type: str
    sandbox_id: str
    body: str


DeliveryState = Literal["pending", "retrying", "delivered", "dead_lettered", "dropped"]


class DeliveryRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    webhook_id: str = Field(alias="webhookId")
    event_id: str = Field(alias="eventId")
    event_type: str = Field(alias="eventType")
    sandbox_id: str = Field(alias="sandboxId")
    state: DeliveryState
    attempts: int = 0
    last_status: int | None = Field(default=None, alias="lastStatus")  # HTTP status
    last_error: str | None = Field(default=None, alias="lastError")
    next_attempt_at: datetime | None = Field(default=None, alias="nextAttemptAt")
    created_at: datetime = Field(alias="createdAt")
    updated_at: datetime = Field(alias="updatedAt")


class DeadLetteredDelivery(BaseModel):
    """A delivery given up on: copied to ``sandbox.dlq.deliverer-send.<sandbox id>`` with why."""

    model_config = ConfigDict(frozen=True)

    schema_version: Literal[1] = 1
    type: Literal["webhook.delivery.dead_lettered"] = "webhook.delivery.dead_lettered"
    sandbox_id: str
    webhook_id: str
    event_id: str
    event_type: str
    attempts: int
    reason: str
    body: str  # the event document (no secret in it)
