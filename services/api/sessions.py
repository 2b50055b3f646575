"""Dashboard sessions: the cookie holds a random session id, never the API key.

The server keeps ``sha256(session id)`` → ``Session`` (user, the digest of the key used to sign
in, a CSRF token) in the KV bucket ``torpor_dashboard_sessions``, whose TTL ends every session
after ``SESSION_SECONDS`` on every replica. Sign-out deletes the entry; revoking the API key
ends its sessions too, because each use re-checks the key by its digest. Without a bus (unit
tests) sessions live in memory."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import UTC, datetime, timedelta
from typing import Protocol

from pydantic import BaseModel, ConfigDict

SESSION_SECONDS = 12 * 3600


class Session(BaseModel):
    model_config = ConfigDict(frozen=True)

    user: str
    key_digest: str  # sha256 of the API key that signed in (the key store's own key)
    csrf: str
    created_at: datetime

    def expired(self, now: datetime) -> bool:
        return now >= self.created_at + timedelta(seconds=SESSION_SECONDS)


class SessionBucket(Protocol):
    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes) -> None: ...

    async def delete(self, key: str) -> None: ...


class MemoryBucket:
    """For an api without a bus (unit tests): one process's sessions."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}

    async def get(self, key: str) -> bytes | None:
        return self._data.get(key)

    async def put(self, key: str, value: bytes) -> None:
        self._data[key] = value

    async def delete(self, key: str) -> None:
        self._data.pop(key, None)


def new_token() -> str:
    return secrets.token_urlsafe(32)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


class Sessions:
    def __init__(self, bucket: SessionBucket) -> None:
        self._bucket = bucket

    async def open(self, user: str, key_digest: str) -> tuple[str, Session]:
        """A new session: ``(session id for the cookie, session)``."""
        session_id = new_token()
        session = Session(
            user=user, key_digest=key_digest, csrf=new_token(), created_at=datetime.now(UTC)
        )
        await self._bucket.put(digest(session_id), session.model_dump_json().encode())
        return session_id, session

    async def get(self, session_id: str) -> Session | None:
        if not session_id or len(session_id) > 128:
            return None
        raw = await self._bucket.get(digest(session_id))
        if raw is None:
            return None
        session = Session.model_validate_json(raw)
        if session.expired(datetime.now(UTC)):
            await self.close(session_id)
            return None
        return session

    async def close(self, session_id: str) -> None:
        if session_id and len(session_id) <= 128:
            await self._bucket.delete(digest(session_id))
