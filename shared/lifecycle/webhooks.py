"""Registering webhooks (the api's side): validation, the secret, owner scoping, the history.

A webhook is its owner's: every read and write goes through the owner's key prefix, so another
user's webhook id is simply not found (404). The secret is generated here (or, as E2B allows,
given by the user), returned once by ``create`` and never again. The URL passes the same address
policy the deliverer applies at every delivery (``shared.webhooks.addresses``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from shared.errors import Conflict, InvalidInput, NotFound
from shared.models.public_events import TYPE_FACTS
from shared.models.webhooks import DeliveryRecord, Webhook, is_webhook_id, new_webhook_id
from shared.ports.webhooks import DeliveryLog, WebhookStore
from shared.webhooks.addresses import (
    AddressPolicy,
    Resolver,
    checked_addresses,
    parse_url,
    system_resolver,
)
from shared.webhooks.signing import new_secret

MAX_WEBHOOKS_PER_USER = 20
MAX_EVENT_TYPES = 16
MAX_NAME = 128
MIN_SECRET, MAX_SECRET = 16, 256

Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Changes:
    name: str | None = None
    url: str | None = None
    events: Sequence[str] | None = None
    enabled: bool | None = None
    secret: str | None = None


def _printable(value: str, field: str, *, limit: int) -> str:
    if len(value) > limit:
        msg = f"{field}: at most {limit} characters"
        raise InvalidInput(msg)
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        msg = f"{field}: control characters are not allowed"
        raise InvalidInput(msg)
    return value


def _events(types: Sequence[str]) -> tuple[str, ...]:
    if not types:
        msg = "events: name at least one event type"
        raise InvalidInput(msg)
    if len(types) > MAX_EVENT_TYPES:
        msg = f"events: at most {MAX_EVENT_TYPES} types"
        raise InvalidInput(msg)
    unknown = [t for t in types if t not in TYPE_FACTS]
    if unknown:
        msg = f"events: unknown event type {unknown[0][:80]!r}; known: {', '.join(TYPE_FACTS)}"
        raise InvalidInput(msg)
    return tuple(dict.fromkeys(types))


def _secret(value: str) -> str:
    if not MIN_SECRET <= len(value) <= MAX_SECRET or not value.isascii() or not value.isprintable():
        msg = (
            f"signatureSecret: {MIN_SECRET}-{MAX_SECRET} printable ASCII characters "
            "(or leave it out: torpor generates one)"
        )
        raise InvalidInput(msg)
    return value


class WebhookRegistry:
    def __init__(
        self,
        hooks: WebhookStore,
        history: DeliveryLog,
        *,
        policy: AddressPolicy,
        resolver: Resolver = system_resolver,
        clock: Clock = _utcnow,
    ) -> None:
        self._hooks = hooks
        self._history = history
        self._policy = policy
        self._resolver = resolver
        self._clock = clock

    async def _url(self, url: str) -> str:
        await checked_addresses(parse_url(url), self._policy, self._resolver)
        return url

    async def create(
        self,
        owner: str,
        *,
        url: str,
        events: Sequence[str],
        name: str = "",
        enabled: bool = True,
        secret: str | None = None,
    ) -> Webhook:
        """The new webhook, secret included (shown to the caller this once)."""
        now = self._clock()
        hook = Webhook(
            id=new_webhook_id(),
            owner=owner,
            name=_printable(name, "name", limit=MAX_NAME),
            url=await self._url(url),
            events=_events(events),
            enabled=enabled,
            secret=_secret(secret) if secret is not None else new_secret(),
            created_at=now,
            updated_at=now,
        )
        if len(await self._hooks.list(owner)) >= MAX_WEBHOOKS_PER_USER:
            msg = f"at most {MAX_WEBHOOKS_PER_USER} webhooks per user; delete one first"
            raise Conflict(msg)
        await self._hooks.create(hook)
        return hook

    async def get(self, owner: str, webhook_id: str) -> Webhook:
        hook = await self._hooks.get(owner, webhook_id) if is_webhook_id(webhook_id) else None
        if hook is None:
            msg = f"webhook {webhook_id[:64]} not found"
            raise NotFound(msg)
        return hook

    async def owned(self, owner: str) -> list[Webhook]:
        return await self._hooks.list(owner)

    async def update(self, owner: str, webhook_id: str, changes: Changes) -> Webhook:
        hook = await self.get(owner, webhook_id)
        update: dict[str, object] = {"updated_at": self._clock()}
        if changes.name is not None:
            update["name"] = _printable(changes.name, "name", limit=MAX_NAME)
        if changes.url is not None:
            update["url"] = await self._url(changes.url)
        if changes.events is not None:
            update["events"] = _events(changes.events)
        if changes.enabled is not None:
            update["enabled"] = changes.enabled
        if changes.secret is not None:
            update["secret"] = _secret(changes.secret)
        new = hook.model_copy(update=update)
        await self._hooks.put(new)
        return new

    async def delete(self, owner: str, webhook_id: str) -> None:
        await self.get(owner, webhook_id)
        await self._hooks.delete(owner, webhook_id)

    async def deliveries(self, owner: str, webhook_id: str, *, limit: int) -> list[DeliveryRecord]:
        await self.get(owner, webhook_id)
        return await self._history.list(webhook_id, limit=limit)
