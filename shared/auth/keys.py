"""API keys and users over two ``Bucket``s (KV ``torpor_api_keys`` and ``torpor_users``).

Keys are ``e2b_`` followed by 40 lowercase hex digits (160 random bits): the format every
``e2b`` SDK version accepts (2.25-2.45 refuse anything else client-side unless
E2B_VALIDATE_API_KEY=false). Keys issued earlier as ``torpor_<48 hex>`` keep working: a key is
looked up by its hash, whatever its prefix.

Because keys are high-entropy, a plain sha256 is enough to make the stored value useless to a
reader of the bucket (no slow KDF needed), and looking a key up by its hash means no secret is
ever compared in variable time.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from datetime import UTC, datetime

from shared.auth.models import ApiKeyInfo, ApiKeyRecord, User, check_user_name
from shared.auth.ports import Bucket, Users
from shared.errors import Conflict, NotFound
from shared.models.quota import QuotaOverride

SECRET_PREFIX = "e2b_"  # noqa: S105 - a prefix, not a secret
_MAX_SECRET_LEN = 256

Clock = Callable[[], datetime]


def _now() -> datetime:
    return datetime.now(UTC)


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_hex(20)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class KvUsers:
    def __init__(self, bucket: Bucket, *, clock: Clock = _now) -> None:
        self._bucket = bucket
        self._clock = clock

    async def get(self, name: str) -> User | None:
        raw = await self._bucket.get(name)
        return User.model_validate_json(raw) if raw is not None else None

    async def ensure(self, name: str, *, admin: bool = False) -> User:
        check_user_name(name)
        for _ in range(3):
            existing = await self.get(name)
            if existing is not None:
                if admin and not existing.admin:
                    promoted = existing.model_copy(update={"admin": True})
                    await self._bucket.put(name, promoted.model_dump_json().encode())
                    return promoted
                return existing
            user = User(name=name, admin=admin, created_at=self._clock())
            try:
                await self._bucket.create(name, user.model_dump_json().encode())
            except Conflict:
                continue  # created concurrently: read it back
            return user
        msg = f"user {name}: too much contention"
        raise Conflict(msg)

    async def set_quota(self, name: str, quota: QuotaOverride | None) -> User:
        """Replace the user's quota override (``None`` or an empty one: back to the defaults)."""
        user = await self.get(name)
        if user is None:
            msg = f"no user {name}"
            raise NotFound(msg)
        stored = None if quota is None or quota.is_empty() else quota
        updated = user.model_copy(update={"quota": stored})
        await self._bucket.put(name, updated.model_dump_json().encode())
        return updated

    async def list(self) -> list[User]:
        out = [u for name in await self._bucket.keys() if (u := await self.get(name)) is not None]
        return sorted(out, key=lambda u: u.name)


class KvApiKeys:
    def __init__(self, keys: Bucket, users: Users, *, clock: Clock = _now) -> None:
        self._keys = keys
        self._users = users
        self._clock = clock

    async def create(self, user: str, *, admin: bool = False) -> tuple[str, str]:
        await self._users.ensure(user, admin=admin)
        secret = new_secret()
        key_id = "key_" + secrets.token_hex(6)
        record = ApiKeyRecord(key_id=key_id, user=user, created_at=self._clock())
        await self._keys.create(hash_secret(secret), record.model_dump_json().encode())
        return record.key_id, secret

    async def _records(self) -> list[tuple[str, ApiKeyRecord]]:
        out: list[tuple[str, ApiKeyRecord]] = []
        for digest in await self._keys.keys():
            raw = await self._keys.get(digest)
            if raw is not None:
                out.append((digest, ApiKeyRecord.model_validate_json(raw)))
        return out

    async def list(self) -> list[ApiKeyInfo]:
        infos = [_info(r) for _, r in await self._records()]
        return sorted(infos, key=lambda i: (i.user, i.created_at))

    async def revoke(self, key_id: str) -> ApiKeyInfo:
        for digest, record in await self._records():
            if record.key_id == key_id:
                if record.revoked_at is not None:
                    return _info(record)
                revoked = record.model_copy(update={"revoked_at": self._clock()})
                await self._keys.put(digest, revoked.model_dump_json().encode())
                return _info(revoked)
        msg = f"no API key with id {key_id}"
        raise NotFound(msg)

    async def user_for_digest(self, digest: str) -> User | None:
        """The user of the key stored under ``digest`` (``hash_secret``), unless revoked: how a
        dashboard session re-checks the key it was opened with, without keeping the key."""
        if len(digest) != 64:
            return None
        raw = await self._keys.get(digest)
        if raw is None:
            return None
        record = ApiKeyRecord.model_validate_json(raw)
        return None if record.revoked else await self._users.get(record.user)

    async def authenticate(self, secret: str) -> User | None:
        if not secret or len(secret) > _MAX_SECRET_LEN:
            return None
        raw = await self._keys.get(hash_secret(secret))
        if raw is None:
            return None
        record = ApiKeyRecord.model_validate_json(raw)
        if record.revoked:
            return None
        return await self._users.get(record.user)


def _info(record: ApiKeyRecord) -> ApiKeyInfo:
    return ApiKeyInfo(
        key_id=record.key_id,
        user=record.user,
        created_at=record.created_at,
        revoked_at=record.revoked_at,
    )
