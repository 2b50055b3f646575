"""The usage ledger's records (KV ``torpor_usage``; fake in ``tests/fakes/usage.py``)."""

from __future__ import annotations

from typing import Protocol

from shared.models.usage import SandboxUsage


class UsageStore(Protocol):
    async def get_with_revision(
        self, owner: str, sandbox_id: str
    ) -> tuple[SandboxUsage, int] | None: ...

    async def write(self, usage: SandboxUsage, *, revision: int | None) -> None:
        """Create (``revision`` None) or compare-and-set; ``Conflict`` if the record moved."""
        ...

    async def of_owner(self, owner: str) -> list[SandboxUsage]: ...

    async def everyone(self) -> list[SandboxUsage]: ...
