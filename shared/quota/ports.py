"""Ports of the quota package."""

from __future__ import annotations

from typing import Protocol

from shared.domain.record import SandboxRecord
from shared.models.quota import QuotaOverride


class CasBucket(Protocol):
    """Key/value with compare-and-set (NATS KV), for rate buckets shared by every replica."""

    async def entry(self, key: str) -> tuple[bytes, int] | None:
        """Value and revision, or ``None`` when absent."""
        ...

    async def create(self, key: str, value: bytes) -> None:
        """``shared.errors.Conflict`` if the key exists."""
        ...

    async def update(self, key: str, value: bytes, *, last: int) -> None:
        """``shared.errors.Conflict`` if the revision is no longer ``last``."""
        ...


class QuotaHolder(Protocol):
    """A user as the quota sees it (``shared.auth.models.User``): only its own limits."""

    @property
    def quota(self) -> QuotaOverride | None: ...


class UserSource(Protocol):
    async def get(self, name: str) -> QuotaHolder | None: ...


class RecordSource(Protocol):
    async def list(self) -> list[SandboxRecord]: ...
