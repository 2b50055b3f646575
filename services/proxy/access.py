"""Who may reach a sandbox port through the proxy: another user's API key sees 404, the daemon
port needs the sandbox's access token (or the owner's API key, or for ``/files`` a signed URL,
which the daemon checks), and with ``allowPublicTraffic=false`` the user ports need the traffic
access token. Refusals are ``RefusedError`` (status and message of the JSON error body)."""

from __future__ import annotations

import hmac
from typing import Protocol
from urllib.parse import parse_qs

from starlette.types import Scope

from services.proxy.routing import Target
from shared.auth.models import User
from shared.auth.traffic import TRAFFIC_TOKEN_HEADER, traffic_token_matches
from shared.domain.record import SandboxRecord

TRAFFIC_HEADER = TRAFFIC_TOKEN_HEADER.encode()


class Authenticator(Protocol):
    async def authenticate(self, secret: str) -> User | None: ...


class RefusedError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", []):
        if k.lower() == name:
            return str(v.decode("latin-1"))
    return None


def signed_files_request(scope: Scope) -> bool:
    """A signed ``/files`` URL (the SDK's ``download_url``/``upload_url``): no header, the
    signature is in the query and only the daemon holds the token that checks it. Only the
    daemon's plain file route, never its RPCs; a scope without a path (the relay's
    header-only check) is not one, so such a request takes the full ASGI path."""
    if scope.get("path") != "/files" or scope.get("method") not in ("GET", "POST"):
        return False
    params = parse_qs(bytes(scope.get("query_string", b"")).decode("latin-1"))
    return any(v.startswith("v1_") for v in params.get("signature", ()))


async def authorise(
    scope: Scope,
    target: Target,
    record: SandboxRecord,
    keys: Authenticator | None,
    *,
    public_ports: bool,
) -> bool:
    """Another user's API key sees 404; the daemon port needs the sandbox's access token
    (or the owner's API key); with ``allowPublicTraffic=false`` the user ports need the
    traffic access token (or the envd token, or the owner's API key). Bearer headers are
    left alone: they may be the app's own. Returns whether the request carried a valid
    credential (False: anonymous)."""
    api_key = header(scope, b"x-api-key")
    if api_key and keys is not None:
        user = await keys.authenticate(api_key.strip())
        if user is None:
            raise RefusedError(401, "invalid API key")
        if not user.admin and user.name != record.owner:
            raise RefusedError(404, f"sandbox {target.sandbox_id} not found")
        return True
    return authorise_by_token(scope, target, record, public_ports=public_ports)


def authorise_by_token(
    scope: Scope, target: Target, record: SandboxRecord, *, public_ports: bool
) -> bool:
    """The part of ``authorise`` after the API key (which needs a KV read): the sandbox's
    tokens and its public-traffic setting. No I/O, so the fast path calls it directly."""
    envd_token = record.envd_access_token
    given = header(scope, b"x-access-token") or ""
    if envd_token and hmac.compare_digest(given.encode(), envd_token.encode()):
        return True
    if target.is_daemon or not public_ports:
        if envd_token and target.is_daemon and signed_files_request(scope):
            return False  # the daemon checks the signature with its token (it answers 401)
        if envd_token:
            raise RefusedError(401, "invalid or missing X-Access-Token for this sandbox")
        return False
    traffic = header(scope, TRAFFIC_HEADER)
    if traffic is not None and traffic_token_matches(record.sandbox_id, envd_token, traffic):
        return True
    if not record.network.allow_public_traffic:
        raise RefusedError(
            403,
            "this sandbox's ports are not public: send its e2b-traffic-access-token",
        )
    return False
