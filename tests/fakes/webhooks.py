"""``WebhookStore``, ``DeliveryLog``, a recording ``Transport`` and a ``Resolver`` in memory."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.models.webhooks import DeliveryRecord, Webhook
from shared.webhooks.addresses import Target


class InMemoryWebhooks:
    def __init__(self) -> None:
        self.hooks: dict[tuple[str, str], Webhook] = {}

    async def create(self, hook: Webhook) -> None:
        self.hooks[(hook.owner, hook.id)] = hook

    async def get(self, owner: str, webhook_id: str) -> Webhook | None:
        return self.hooks.get((owner, webhook_id))

    async def list(self, owner: str) -> list[Webhook]:
        return sorted(
            (h for (o, _), h in self.hooks.items() if o == owner), key=lambda h: h.created_at
        )

    async def put(self, hook: Webhook) -> None:
        self.hooks[(hook.owner, hook.id)] = hook

    async def delete(self, owner: str, webhook_id: str) -> bool:
        return self.hooks.pop((owner, webhook_id), None) is not None


class InMemoryDeliveryLog:
    def __init__(self) -> None:
        self.records: dict[tuple[str, str], DeliveryRecord] = {}

    async def get(self, webhook_id: str, event_id: str) -> DeliveryRecord | None:
        return self.records.get((webhook_id, event_id))

    async def put(self, record: DeliveryRecord) -> None:
        self.records[(record.webhook_id, record.event_id)] = record

    async def list(self, webhook_id: str, *, limit: int) -> list[DeliveryRecord]:
        mine = [r for (w, _), r in self.records.items() if w == webhook_id]
        return sorted(mine, key=lambda r: r.updated_at, reverse=True)[:limit]


class TransportDown(Exception):
    """What the fake transport raises for an unreachable receiver."""


@dataclass(frozen=True)
class FakeAnswer:
    status: int


@dataclass
class RecordingTransport:
    """Answers the queued statuses in turn (``None``: unreachable), then 200; records each
    request (target, address, body, headers)."""

    answers: list[int | None] = field(default_factory=list)
    sent: list[tuple[Target, str, bytes, dict[str, str]]] = field(default_factory=list)

    async def post(
        self, target: Target, address: str, body: bytes, headers: dict[str, str]
    ) -> FakeAnswer:
        self.sent.append((target, address, body, headers))
        status = self.answers.pop(0) if self.answers else 200
        if status is None:
            raise TransportDown("connection failed (ConnectError)")
        return FakeAnswer(status)


@dataclass
class FakeResolver:
    """Host -> addresses; a name may change its answer between calls (DNS rebinding)."""

    names: dict[str, list[list[str]]] = field(default_factory=dict)

    async def __call__(self, host: str, port: int) -> list[str]:
        answers = self.names.get(host)
        if answers is None:
            return [host]  # an IP literal resolves to itself
        return answers.pop(0) if len(answers) > 1 else answers[0]
