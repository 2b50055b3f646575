"""Settings of the API service (``TORPOR_*`` environment variables, read once in ``main``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from shared.settings import SettingsBase, constant

# The envd protocol version the in-sandbox daemon implements; must equal
# ``services/envd/version.py: ENVD_VERSION`` (a test checks it). Copied, not imported: the API
# must not depend on the daemon's package.
ENVD_VERSION = "0.6.4"


class ApiSettings(SettingsBase):
    host: str = Field(default="127.0.0.1", description="TORPOR_HOST: listen address")
    port: int = Field(default=3000, ge=0, le=65535, description="TORPOR_PORT: listen port")
    sandbox_domain: str = "localhost"
    """`domain` returned to the SDK. Without `E2B_SANDBOX_URL` the SDK dials
    `https://{port}-{id}.{domain}`. `localhost` keeps a misconfigured client on loopback."""
    client_id: str = constant("torpor")
    """`clientID` in E2B responses."""
    cpu_count: int = constant(2)
    """Resources reported by get_info (reported only, not enforced)."""
    memory_mb: int = constant(512)
    """Resources reported by get_info (reported only, not enforced)."""
    disk_size_mb: int = constant(1024)
    """Resources reported by get_info (reported only, not enforced)."""
    default_timeout: int = constant(300, ge=1)
    """Seconds; E2B create without a timeout. The native API's default is also 300."""
    max_timeout: int = Field(default=86400, ge=1)
    """Largest accepted timeout (400 on E2B paths, 422 on native paths)."""
    create_wait: float = constant(60.0)
    """Seconds a create request waits for the sandbox to run (then 504; the create still
    completes)."""
    transition_wait: float = constant(55.0)
    """The same for pause / resume / kill."""
    list_max_limit: int = constant(100)
    """Largest page of `GET /v2/sandboxes`."""
    max_body_bytes: int = constant(1024 * 1024, ge=1024)
    """Request body limits (see "HTTP limits" below)."""
    body_timeout: float = constant(30.0, gt=0)
    """Request body limits (see "HTTP limits" below)."""
    insecure_sandboxes: Literal["secure", "honor", "refuse"] = "secure"
    """What a create's `secure: false` does (E2B's SDKs before 2.x sent it; the Code Interpreter
    tests still pass it, which SDK 2.63 no longer sends). `secure` (E2B's API today: "ignored, all
    communication is always secured"): accepted, the sandbox still gets its access token (the
    answer carries it). `honor`: no token, so the daemon answers whoever names the sandbox's id
    through the proxy (ids are 98 random bits; with an `Idempotency-Key`, whose id is derived,
    or `allowPublicTraffic: false`, which needs a token, it is a 400). `refuse`: 400.
    docs/security.md, "secure=False"."""
    cookie_secure: bool = False
    """`true`: always mark the dashboard session cookie `Secure`. Otherwise it is `Secure` when
    the request came over HTTPS, directly or through a proxy listed in
    `TORPOR_HTTP_TRUSTED_PROXIES` that sends `X-Forwarded-Proto: https`."""
    default_template: str = constant("sandbox-base")
    """What E2B's default template name ``base`` (the SDK's default) creates."""
    snapshot_retention_seconds: int = Field(default=30 * 86400, ge=1)
    """Seconds a stored snapshot is kept (listed, usable); then the snapshotter deletes it,
    files included."""

    template_upload_key: SecretStr | None = None
    """Signs the build-context upload URLs of template builds (HMAC-SHA256). Every API replica
    needs the same key; unset, each API process makes its own at start (one replica only)."""
    template_max_upload_bytes: int = constant(256 * 2**20, ge=1024)
    """Largest build-context archive one upload may send."""
    template_max_templates: int = constant(50, ge=0)
    """Templates one user may have."""
    template_max_concurrent_builds: int = constant(2, ge=1)
    """Builds one user may have running at once (429 beyond)."""

    def resolve_template(self, name: str) -> str:
        return self.default_template if name == "base" else name
