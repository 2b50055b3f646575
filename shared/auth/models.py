"""Users and API-key records, as stored in KV ``torpor_users`` and ``torpor_api_keys``."""

from __future__ import annotations

import re
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.models.quota import QuotaOverride

# NATS KV keys allow [-/_=.a-zA-Z0-9]; a user name is also a label value on Kubernetes objects.
_USER_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")


def check_user_name(name: str) -> str:
    if not _USER_NAME.match(name):
        msg = (
            f"invalid user name {name!r}: use 1-63 letters, digits, '.', '_' or '-', "
            "starting and ending with a letter or digit"
        )
        raise ValueError(msg)
    return name


class User(BaseModel):
    model_config = ConfigDict(frozen=True)

    schema_version: int = 1
    name: str
    admin: bool = False
    created_at: datetime
    quota: QuotaOverride | None = None  # None: the defaults (TORPOR_QUOTA_*)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        return check_user_name(value)


class ApiKeyRecord(BaseModel):
    """What is stored under ``sha256(secret)``; the secret itself is never stored."""

    model_config = ConfigDict(frozen=True)

    schema_version: int = 1
    key_id: str
    user: str
    created_at: datetime
    revoked_at: datetime | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


class ApiKeyInfo(BaseModel):
    """An API key as listed to operators: its public id, never its secret or hash."""

    model_config = ConfigDict(frozen=True)

    key_id: str
    user: str
    created_at: datetime
    revoked_at: datetime | None = Field(default=None)
