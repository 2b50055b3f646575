"""``WebhookStore`` and ``DeliveryLog`` over NATS KV (``torpor_webhooks``,
``torpor_webhook_deliveries``); keys are built in ``shared.models.webhooks``."""

from __future__ import annotations

import asyncio
import contextlib

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from pydantic import ValidationError

from shared.bus.kv import LazyBucket, key_names, opened, read_value
from shared.errors import Conflict
from shared.models.webhooks import (
    DeliveryRecord,
    Webhook,
    delivery_key,
    owner_token,
    webhook_key,
)


class KvWebhookStore:
    def __init__(self, kv: KeyValue | LazyBucket) -> None:
        self._bucket = kv

    async def create(self, hook: Webhook) -> None:
        kv = await opened(self._bucket)
        try:
            await kv.create(webhook_key(hook.owner, hook.id), hook.model_dump_json().encode())
        except KeyWrongLastSequenceError as e:
            msg = f"webhook {hook.id} already exists"
            raise Conflict(msg) from e

    async def get(self, owner: str, webhook_id: str) -> Webhook | None:
        kv = await opened(self._bucket)
        raw = await read_value(kv, webhook_key(owner, webhook_id))
        if raw is None:
            return None
        hook = Webhook.model_validate_json(raw)
        return hook if hook.owner == owner else None

    async def list(self, owner: str) -> list[Webhook]:
        kv = await opened(self._bucket)
        keys = await key_names(kv, under=f"{owner_token(owner)}.")
        raws = await asyncio.gather(*(read_value(kv, k) for k in keys))
        hooks = []
        for raw in raws:
            if raw is None:
                continue
            with contextlib.suppress(ValidationError):
                hook = Webhook.model_validate_json(raw)
                if hook.owner == owner:
                    hooks.append(hook)
        return sorted(hooks, key=lambda h: h.created_at)

    async def put(self, hook: Webhook) -> None:
        kv = await opened(self._bucket)
        await kv.put(webhook_key(hook.owner, hook.id), hook.model_dump_json().encode())

    async def delete(self, owner: str, webhook_id: str) -> bool:
        kv = await opened(self._bucket)
        if await self.get(owner, webhook_id) is None:
            return False
        with contextlib.suppress(KeyNotFoundError):
            await kv.delete(webhook_key(owner, webhook_id))
        return True


class KvDeliveryLog:
    def __init__(self, kv: KeyValue | LazyBucket) -> None:
        self._bucket = kv

    async def get(self, webhook_id: str, event_id: str) -> DeliveryRecord | None:
        kv = await opened(self._bucket)
        raw = await read_value(kv, delivery_key(webhook_id, event_id))
        return None if raw is None else DeliveryRecord.model_validate_json(raw)

    async def put(self, record: DeliveryRecord) -> None:
        kv = await opened(self._bucket)
        key = delivery_key(record.webhook_id, record.event_id)
        await kv.put(key, record.model_dump_json(by_alias=True).encode())

    async def list(self, webhook_id: str, *, limit: int) -> list[DeliveryRecord]:
        kv = await opened(self._bucket)
        keys = await key_names(kv, under=f"{webhook_id}.")
        raws = await asyncio.gather(*(read_value(kv, k) for k in keys))
        records = []
        for raw in raws:
            if raw is not None:
                with contextlib.suppress(ValidationError):
                    records.append(DeliveryRecord.model_validate_json(raw))
        records.sort(key=lambda r: r.updated_at, reverse=True)
        return records[:limit]
