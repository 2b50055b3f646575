"""``UsageStore`` in memory, with KV's compare-and-set rule (a stale revision is ``Conflict``)."""

from __future__ import annotations

from shared.errors import Conflict
from shared.models.usage import SandboxUsage


class InMemoryUsage:
    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], tuple[SandboxUsage, int]] = {}
        self._revision = 0

    async def get_with_revision(
        self, owner: str, sandbox_id: str
    ) -> tuple[SandboxUsage, int] | None:
        return self.entries.get((owner, sandbox_id))

    async def write(self, usage: SandboxUsage, *, revision: int | None) -> None:
        key = (usage.owner, usage.sandbox_id)
        current = self.entries.get(key)
        if (current[1] if current else None) != revision:
            msg = f"usage of {usage.sandbox_id} changed"
            raise Conflict(msg)
        self._revision += 1
        self.entries[key] = (usage, self._revision)

    async def of_owner(self, owner: str) -> list[SandboxUsage]:
        return [u for (o, _), (u, _) in self.entries.items() if o == owner]

    async def everyone(self) -> list[SandboxUsage]:
        return [u for u, _ in self.entries.values()]
