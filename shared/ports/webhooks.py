"""Ports of the webhooks: registrations and the delivery history (KV adapters in
``shared/bus/webhooks.py``, in-memory fakes in ``tests/fakes/webhooks.py``)."""

from __future__ import annotations

from typing import Protocol

from shared.models.webhooks import DeliveryRecord, Webhook


class WebhookStore(Protocol):
    async def create(self, hook: Webhook) -> None: ...

    async def get(self, owner: str, webhook_id: str) -> Webhook | None:
        """``None`` for another owner's webhook too: the key includes the owner."""
        ...

    async def list(self, owner: str) -> list[Webhook]: ...

    async def put(self, hook: Webhook) -> None: ...

    async def delete(self, owner: str, webhook_id: str) -> bool: ...


class DeliveryLog(Protocol):
    async def get(self, webhook_id: str, event_id: str) -> DeliveryRecord | None: ...

    async def put(self, record: DeliveryRecord) -> None: ...

    async def list(self, webhook_id: str, *, limit: int) -> list[DeliveryRecord]:
        """The newest ``limit`` entries (by last update), newest first."""
        ...
