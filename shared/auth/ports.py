"""Ports of the auth package, as narrow Protocols."""

from __future__ import annotations

from typing import Protocol

from shared.auth.models import ApiKeyInfo, User


class Bucket(Protocol):
    """A key/value bucket of bytes (NATS KV in production, a dict in unit tests)."""

    async def get(self, key: str) -> bytes | None:
        """The value, or ``None`` when the key is absent or deleted."""
        ...

    async def put(self, key: str, value: bytes) -> None: ...

    async def create(self, key: str, value: bytes) -> None:
        """Insert; ``shared.errors.Conflict`` if the key already exists."""
        ...

    async def keys(self) -> list[str]: ...


class Users(Protocol):
    async def get(self, name: str) -> User | None: ...

    async def ensure(self, name: str, *, admin: bool = False) -> User:
        """Create the user if missing; ``admin=True`` also grants the role to an existing user."""
        ...

    async def list(self) -> list[User]: ...


class ApiKeys(Protocol):
    async def create(self, user: str, *, admin: bool = False) -> tuple[str, str]:
        """Issue a key for ``user`` (created if missing): ``(key_id, secret)``. The secret is
        returned once and never stored."""
        ...

    async def list(self) -> list[ApiKeyInfo]: ...

    async def revoke(self, key_id: str) -> ApiKeyInfo:
        """Revoke by public id; ``shared.errors.NotFound`` if there is no such key."""
        ...

    async def authenticate(self, secret: str) -> User | None:
        """The key's user, or ``None`` for an unknown, revoked or malformed key."""
        ...
