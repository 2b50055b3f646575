"""Second line of defence against secrets in logs, dead letters and failure reasons.

The first line is not putting secrets there at all (commands carry no env values, events no
tokens). This masks what slips through anyway: by *key* (a value under a key that names a secret,
every value of an env mapping) and by *shape* (API keys, bearer tokens, header values, passwords in
URLs). Used by the structlog processor (``shared/logging.py``), the DLQ middleware and the
lifecycle's failure reasons.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

MASK = "***"

# A key naming a secret: its value is masked whatever it looks like.
_SECRET_KEY = re.compile(
    r"(token|password|passwd|secret|api[_-]?key|authorization|cookie|credential|nats_creds)",
    re.IGNORECASE,
)
# A key holding a user's environment: every value in it is masked, the names stay.
_ENV_KEY = re.compile(r"^(envs?|env_?vars|envVars|environment)$", re.IGNORECASE)

_SHAPES: tuple[tuple[re.Pattern[str], str], ...] = (
    # API keys: torpor_<hex>, E2B's e2b_<hex>, and the dashboard's session values if shaped so.
    (re.compile(r"\b(torpor|e2b)_[A-Za-z0-9]{16,}"), rf"\1_{MASK}"),
    # Header values, in any rendering: "X-Access-Token: v", 'x-api-key': 'v', (b'authorization',
    # b'Bearer v') as ASGI scopes print them.
    (
        re.compile(
            r"((?:x-access-token|x-api-key|authorization|x-traffic-access-token|e2b-traffic-access-token|cookie)"
            r"['\"]?\s*[:=,]\s*(?:b(?=['\"]))?['\"]?(?:bearer\s+)?)[^'\"\s,;)}\]]+",
            re.IGNORECASE,
        ),
        rf"\1{MASK}",
    ),
    (re.compile(r"\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE), rf"\1 {MASK}"),
    # Webhook signing secrets (shared/webhooks/signing.py: whsec_<urlsafe base64>).
    (re.compile(r"\bwhsec_[A-Za-z0-9_-]{8,}"), f"whsec_{MASK}"),
    # user:password@ in URLs (nats://, http://).
    (re.compile(r"(//)[^/@\s:]+:[^/@\s]+@"), rf"\1{MASK}@"),
    # key=value / "key": "value" pairs whose key names a secret.
    (
        re.compile(
            r"((?:access_?token|accessToken|envd_access_token|traffic_?access_?token|password|"
            r"api_?key|secret)['\"]?\s*[:=]\s*['\"]?)[^'\"\s,;)}\]]+",
            re.IGNORECASE,
        ),
        rf"\1{MASK}",
    ),
)


def redact_text(text: str) -> str:
    for pattern, replacement in _SHAPES:
        text = pattern.sub(replacement, text)
    return text


# Names of a secret's public handle, not the secret: key ids, hashes.
_HANDLE_SUFFIXES = ("_id", "_ids", "_hash", "_sha256", "_prefix", "_env")


def redact_value(key: str, value: Any) -> Any:
    """``value`` as it may be shown under ``key``."""
    if _ENV_KEY.match(key) and isinstance(value, Mapping):
        return {str(k): MASK for k in value}
    if (
        _SECRET_KEY.search(key)
        and not key.lower().endswith(_HANDLE_SUFFIXES)
        and value not in (None, "", False)
    ):
        return MASK if not isinstance(value, Mapping | list) else redact_any(value, secret=True)
    return redact_any(value)


def redact_any(value: Any, *, secret: bool = False) -> Any:
    if isinstance(value, str):
        return MASK if secret else redact_text(value)
    if isinstance(value, Mapping):
        return {k: redact_value(str(k), v) if not secret else MASK for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_any(v, secret=secret) for v in value]
    return value


def redact_json_bytes(data: bytes) -> bytes:
    """A JSON body with its secrets masked; anything else by shape only."""
    try:
        parsed = json.loads(data)
    except ValueError:
        text = data.decode(errors="replace")
        masked = redact_text(text)
        return data if masked == text else masked.encode()
    masked_json = redact_any(parsed)
    return data if masked_json == parsed else json.dumps(masked_json).encode()  # original if clean
