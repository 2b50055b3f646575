"""The SDK's signed ``/files`` URLs (``download_url``/``upload_url`` of a secure sandbox):
``signature=v1_`` + unpadded base64 of sha256(``path:operation:username:token[:expiration]``),
``operation`` ``read`` for GET and ``write`` otherwise, ``signature_expiration`` unix seconds."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

# Unix seconds as the SDK writes them; int() alone would also take "١٢", "+5" or " 5".
_SECONDS = re.compile(r"^[0-9]{1,12}$")

INVALID = "invalid signature"
EXPIRED = "signature is already expired"


def _digest(raw: str) -> str:
    return base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()


def signature_problem(params: dict[str, str], method: str, token: str, now: float) -> str | None:
    """``None`` when ``params`` carry a valid, unexpired signature for this request; else why
    not, in envd's words. The digest is checked first, so an expired URL is told apart only
    for a signature made with this sandbox's token."""
    signature = params.get("signature", "")
    if not signature.startswith("v1_"):
        return INVALID
    operation = "read" if method == "GET" else "write"
    raw = f"{params.get('path', '')}:{operation}:{params.get('username', '')}:{token}"
    expiration = params.get("signature_expiration", "")
    if expiration:
        if not _SECONDS.match(expiration):
            return INVALID
        raw += f":{expiration}"
    if not hmac.compare_digest(signature[3:].encode(), _digest(raw).encode()):
        return INVALID
    if expiration and int(expiration) < now:
        return EXPIRED
    return None
