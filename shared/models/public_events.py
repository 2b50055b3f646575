"""Lifecycle events as users see them: the events API (``GET /events/sandboxes…``) and webhook
deliveries carry the same document, in E2B's shape (``version``, ``id``, ``type``,
``eventData``, ``sandboxId``, ``sandboxTeamId``, ``sandboxTemplateId``, ``timestamp``).

``id`` is the event's ``Nats-Msg-Id`` (``paused:<sid>:g3``): stable across redeliveries and
re-publishes, so a receiver de-duplicates on it. Internal facts (``snapshotted``: a pause in
progress; ``activity``: throttled traffic reports) are not public.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shared.redaction import redact_any

VERSION = "v1"
LIFECYCLE = "sandbox.lifecycle."

# Bus fact (``sandbox.evt.<fact>.<sid>``) -> public type. E2B's names where E2B has the event
# (``updated`` is E2B's name for a new timeout, ``checkpointed`` for a stored snapshot); torpor's
# own facts keep their names under the same prefix.
FACT_TYPES: dict[str, str] = {
    "created": LIFECYCLE + "created",
    "paused": LIFECYCLE + "paused",
    "resumed": LIFECYCLE + "resumed",
    "killed": LIFECYCLE + "killed",
    "timeout_set": LIFECYCLE + "updated",
    "snapshot_taken": LIFECYCLE + "checkpointed",
    "failed": LIFECYCLE + "failed",
    "expired": LIFECYCLE + "expired",
    "expiring": LIFECYCLE + "expiring",  # an automatic pause or kill is near
    "hook": LIFECYCLE + "hook",  # a lifecycle hook ran (docs/lifecycle-hooks.md)
}
TYPE_FACTS: dict[str, str] = {v: k for k, v in FACT_TYPES.items()}
PUBLIC_TYPES: tuple[str, ...] = tuple(FACT_TYPES.values())

# Envelope fields of a bus message that the public document carries elsewhere.
_ENVELOPE = frozenset({"schema_version", "type", "sandbox_id", "at"})


class PublicEvent(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, serialize_by_alias=True)

    version: str = VERSION
    id: str
    type: str
    event_data: dict[str, Any] | None = Field(default=None, alias="eventData")
    sandbox_id: str = Field(alias="sandboxId")
    sandbox_team_id: str | None = Field(default=None, alias="sandboxTeamId")
    sandbox_template_id: str | None = Field(default=None, alias="sandboxTemplateId")
    timestamp: datetime
    # Not E2B's: the position in the event stream (a cursor for paging; ordering within a page).
    seq: int = 0

    def body(self) -> bytes:
        """The exact bytes a webhook delivery signs and sends."""
        return self.model_dump_json(by_alias=True).encode()


def fact_of(subject: str) -> tuple[str, str] | None:
    """``sandbox.evt.paused.sbx1`` -> ``("paused", "sbx1")``; ``None`` for any other subject."""
    parts = subject.split(".")
    if len(parts) != 4 or parts[0] != "sandbox" or parts[1] != "evt":
        return None
    return parts[2], parts[3]


def public_event(
    subject: str,
    data: bytes,
    *,
    event_id: str | None,
    seq: int,
    stored_at: datetime | None = None,
    owner: str | None = None,
    template: str | None = None,
) -> PublicEvent | None:
    """The public document of one stored bus event; ``None`` for internal facts."""
    found = fact_of(subject)
    if found is None or found[0] not in FACT_TYPES:
        return None
    fact, sandbox_id = found
    try:
        payload = json.loads(data or b"{}")
    except ValueError:
        payload = {}
    if not isinstance(payload, dict):
        payload = {}
    at = _time(payload.get("at")) or stored_at or datetime.now(UTC)
    extra = {k: v for k, v in payload.items() if k not in _ENVELOPE}
    if fact == "timeout_set" and "deadline" in extra:
        extra["set_timeout"] = extra.pop("deadline")  # E2B's eventData key for this event
    return PublicEvent(
        id=event_id or f"{fact}:{sandbox_id}:s{seq}",
        type=FACT_TYPES[fact],
        event_data=redact_any(extra) or None,
        sandbox_id=sandbox_id,
        sandbox_team_id=owner,
        sandbox_template_id=template,
        timestamp=at,
        seq=seq,
    )


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
