"""Ports of the quota package."""

from __future__ import annotations

from typing import Protocol

from shared.auth.models import User
from shared.domain.record import SandboxRecord


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


class UserSource(Protocol):
    async def get(self, name: str) -> User | None: ...


class RecordSource(Protocol):
    async def list(self) -> list[SandboxRecord]: ...
