"""Applying one lifecycle event to the ledger: read the sandbox's usage record, compute the new
one (``shared.models.usage.apply``), compare-and-set it. A lost race re-reads and re-applies
(the re-read record may already hold this event: then nothing changes).

Each sandbox is weighed by its template's size (``services.ledger.sizes``), fixed at the
sandbox's first event and stored on its usage record: a template changed later does not re-price
seconds already counted, nor those still to come for that sandbox."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import structlog
from prometheus_client import CollectorRegistry

from services.ledger.metrics import LedgerMetrics
from services.ledger.sizes import TemplateSizes
from shared.errors import Conflict
from shared.models.public_events import fact_of
from shared.models.usage import FACTS, SandboxUsage, apply, totals
from shared.ports.bus import SandboxStore
from shared.ports.usage import UsageStore

log = structlog.get_logger()

_CAS_ATTEMPTS = 8


class Ledger:
    def __init__(
        self,
        *,
        records: SandboxStore,
        usage: UsageStore,
        sizes: TemplateSizes,
        metrics: LedgerMetrics | None = None,
    ) -> None:
        self.metrics = metrics if metrics is not None else LedgerMetrics(CollectorRegistry())
        self._records = records
        self._usage = usage
        self._sizes = sizes
        self._published_all = False

    async def on_event(self, subject: str, data: bytes, *, msg_id: str | None, seq: int) -> str:
        found = fact_of(subject)
        if found is None or found[0] not in FACTS:
            return "ignored"
        fact, sandbox_id = found
        record = await self._records.get(sandbox_id)
        if record is None:
            self.metrics.applied.labels("unattributed").inc()
            log.info("usage_event_unattributed", subject=subject)
            return "unattributed"
        payload = json.loads(data or b"{}")
        at = datetime.fromisoformat(str(payload["at"]).replace("Z", "+00:00"))
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        for _ in range(_CAS_ATTEMPTS):
            current = await self._usage.get_with_revision(record.owner, sandbox_id)
            # The size is the one fixed at the sandbox's first event, once there is a record.
            size = current[0].size if current else self._sizes.of(record.template)
            new = apply(
                current[0] if current else None,
                fact=fact,
                payload=payload,
                at=at,
                event_id=msg_id or f"{fact}:{sandbox_id}:s{seq}",
                seq=seq,
                sandbox_id=sandbox_id,
                owner=record.owner,
                template=record.template,
                size=size,
            )
            if new is None:
                self.metrics.applied.labels("duplicate").inc()
                return "duplicate"
            try:
                await self._usage.write(new, revision=current[1] if current else None)
            except Conflict:
                continue
            self.metrics.applied.labels(fact).inc()
            await self._publish(record.owner)
            return fact
        msg = f"usage of {sandbox_id}: too much contention"
        raise Conflict(msg)

    async def _publish(self, owner: str) -> None:
        if not self._published_all:  # after a start: every user's series, once
            self._published_all = True
            by_owner: dict[str, list[SandboxUsage]] = {}
            for u in await self._usage.everyone():
                by_owner.setdefault(u.owner, []).append(u)
            for user, usages in by_owner.items():
                self.metrics.publish(user, totals(usages))
        self.metrics.publish(owner, totals(await self._usage.of_owner(owner)))
