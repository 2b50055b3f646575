"""A create's ``secure: false`` (E2B's SDKs before 2.x sent it; E2B's API now documents it as
ignored, every sandbox secured), decided by ``TORPOR_INSECURE_SANDBOXES``:

- ``secure`` (default): accepted, and the sandbox still gets its access token (the answer carries
  it, so a client sees it is secured), as E2B does today.
- ``honor``: no access token: the daemon answers whoever names the sandbox's id through the
  proxy, as E2B's ``secure=False`` once did. The id is then the only secret: 98 random bits,
  never one derived from an ``Idempotency-Key`` (400); ``allowPublicTraffic: false`` needs a
  token to derive the traffic token from (400). Another user's API key still gets 404.
- ``refuse``: 400.

docs/security.md, "secure=False"."""

from __future__ import annotations

from services.api.errors import ApiError
from services.api.settings import ApiSettings
from shared.models.network import NetworkPolicy


def wants_token(
    settings: ApiSettings, secure: bool | None, idempotency_key: str | None, network: NetworkPolicy
) -> bool:
    """Whether the new sandbox gets an access token; ``ApiError`` 400 for what is refused."""
    if secure is not False or settings.insecure_sandboxes == "secure":
        return True
    if settings.insecure_sandboxes == "refuse":
        raise ApiError(400, "secure=false is refused by this torpor (TORPOR_INSECURE_SANDBOXES)")
    if idempotency_key:
        raise ApiError(
            400, "secure=false cannot take an Idempotency-Key: its sandbox id would be derivable"
        )
    if not network.allow_public_traffic:
        raise ApiError(
            400,
            "secure=false cannot take allowPublicTraffic=false: "
            "there is no token to derive the traffic access token from",
        )
    return False
