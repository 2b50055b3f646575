"""Signatures of webhook deliveries: HMAC-SHA256 with the webhook's secret over
``<unix seconds>.<raw body>``, sent as ``Torpor-Signature: t=<unix seconds>,v1=<hex digest>``.

The timestamp is inside the signed bytes, so a captured delivery cannot be replayed later with a
fresh one; receivers reject timestamps older than a tolerance (``verify``, 5 minutes by default).
The recipe receivers follow is in docs/webhooks.md; ``verify`` is the reference implementation.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SIGNATURE_HEADER = "Torpor-Signature"
SCHEME = "v1"
DEFAULT_TOLERANCE = 300
SECRET_PREFIX = "whsec_"  # noqa: S105 (a prefix, shaped for redaction)


class InvalidSignature(ValueError):
    """The delivery is not signed with this secret, or it is stale."""


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def digest(secret: str, body: bytes, timestamp: int) -> str:
    signed = f"{timestamp}.".encode() + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The ``Torpor-Signature`` header value."""
    return f"t={timestamp},{SCHEME}={digest(secret, body, timestamp)}"


def verify(
    secret: str, header: str, body: bytes, *, now: int, tolerance: int = DEFAULT_TOLERANCE
) -> int:
    """The delivery's timestamp if ``header`` signs ``body`` with ``secret`` within
    ``tolerance`` seconds of ``now``; else ``InvalidSignature``. Several ``v1=`` values (a
    rotation) are accepted if any matches."""
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t" and value.isdigit() and len(value) <= 12:
            timestamp = int(value)
        elif key == SCHEME:
            candidates.append(value)
    if timestamp is None or not candidates:
        msg = "malformed signature header"
        raise InvalidSignature(msg)
    if abs(now - timestamp) > tolerance:
        msg = f"stale signature: {abs(now - timestamp)} s from now (tolerance {tolerance} s)"
        raise InvalidSignature(msg)
    expected = digest(secret, body, timestamp)
    if not any(hmac.compare_digest(expected, c) for c in candidates):
        msg = "signature does not match"
        raise InvalidSignature(msg)
    return timestamp
