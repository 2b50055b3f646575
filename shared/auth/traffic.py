"""A sandbox's traffic access token: what a client sends as ``e2b-traffic-access-token`` to
reach the sandbox's user ports through the proxy when ``allowPublicTraffic`` is false.

It is derived, never stored: HMAC-SHA256 keyed by the sandbox's envd access token (already a
per-sandbox secret on the record) over a fixed label and the sandbox id. The API returns it on
create/connect; the proxy recomputes it to check a request. It is a different value from the
envd token and does not reveal it, so holding it opens the user ports and nothing else.
"""

from __future__ import annotations

import hashlib
import hmac

TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token"  # noqa: S105 - a header name
_LABEL = b"torpor-traffic-access-token-v1\0"


def traffic_token(sandbox_id: str, envd_access_token: str | None) -> str | None:
    if not envd_access_token:
        return None
    mac = hmac.new(envd_access_token.encode(), _LABEL + sandbox_id.encode(), hashlib.sha256)
    return mac.hexdigest()


def traffic_token_matches(sandbox_id: str, envd_access_token: str | None, given: str) -> bool:
    expected = traffic_token(sandbox_id, envd_access_token)
    return expected is not None and hmac.compare_digest(expected.encode(), given.encode())
