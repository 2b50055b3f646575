"""Settings of the API service (``TORPOR_*`` environment variables, read once in ``main``)."""

from __future__ import annotations

from pydantic import Field

from shared.settings import BusSettings, FeatureFlags, LoggingSettings, _Base

# The envd protocol version the in-sandbox daemon implements; must equal
# ``services/envd/version.py: ENVD_VERSION`` (a test checks it). Copied, not imported: the API
# must not depend on the daemon's package.
ENVD_VERSION = "0.6.4"


class ApiSettings(_Base):
    host: str = Field(default="127.0.0.1", description="TORPOR_HOST: listen address")
    port: int = Field(default=3000, ge=0, le=65535, description="TORPOR_PORT: listen port")
    # The sandbox domain returned as ``domain``: the SDK then dials
    # ``https://{port}-{id}.{domain}`` unless E2B_SANDBOX_URL is set. "localhost" keeps a
    # misconfigured client on loopback instead of sending traffic to the E2B cloud.
    sandbox_domain: str = "localhost"
    client_id: str = "torpor"
    # Resources reported by get_info (the local runtime does not enforce them).
    cpu_count: int = 2
    memory_mb: int = 512
    disk_size_mb: int = 1024
    default_timeout: int = Field(default=300, ge=1)
    max_timeout: int = Field(default=86400, ge=1)
    # How long a request waits for a transition (create / pause / resume / kill) to finish.
    create_wait: float = 60.0
    transition_wait: float = 55.0
    list_max_limit: int = 100
    # TORPOR_MAX_BODY_BYTES: the largest request body (413 beyond); TORPOR_BODY_TIMEOUT: how long
    # a body may take to arrive in full (408 beyond). Both checked before any route runs.
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    body_timeout: float = Field(default=30.0, gt=0)
    # TORPOR_COOKIE_SECURE: always mark the dashboard cookie Secure. Otherwise it is Secure when
    # the request came over HTTPS (directly, or per X-Forwarded-Proto from a trusted proxy).
    cookie_secure: bool = False
    # TORPOR_DEFAULT_TEMPLATE: what E2B's default template name "base" (the SDK's default when
    # no template is given) creates.
    default_template: str = "sandbox-base"

    def resolve_template(self, name: str) -> str:
        return self.default_template if name == "base" else name


class ApiServiceSettings:
    """Everything ``services.api.main`` reads, composed from the shared pieces."""

    def __init__(
        self,
        api: ApiSettings,
        bus: BusSettings,
        logging: LoggingSettings,
        flags: FeatureFlags,
    ) -> None:
        self.api = api
        self.bus = bus
        self.logging = logging
        self.flags = flags
