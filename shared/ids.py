"""Identifier rules shared by every part of torpor (user names: ``shared.auth.models``)."""

from __future__ import annotations

import hashlib
import re

# A sandbox id must be usable as a NATS subject token, a KV key, a DNS label
# (``{port}-{id}.{domain}``) and a Kubernetes object name: lowercase RFC 1123 label.
SANDBOX_ID_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
_SANDBOX_ID_RE = re.compile(SANDBOX_ID_PATTERN)


def is_valid_sandbox_id(value: str) -> bool:
    return bool(_SANDBOX_ID_RE.match(value))


def owned_sandbox_id(owner: str, name: str) -> str:
    """The sandbox id behind a native sandbox name: names are unique per owner, not globally.

    Deterministic, so every API replica maps (owner, name) to the same id with no index to keep
    consistent, and two users' sandboxes of the same name are different sandboxes with different
    ids, events and history: a create never learns whether someone else holds a name. The ``n``
    prefix keeps these apart from generated (``i``…) ids.
    """
    digest = hashlib.sha256(f"{owner}\0{name}".encode()).hexdigest()
    return f"n{digest[:24]}"
