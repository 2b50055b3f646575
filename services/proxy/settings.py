"""Settings of the sandbox proxy (``TORPOR_PROXY_*``)."""

from __future__ import annotations

from pydantic import AliasChoices, Field

from shared.settings import SettingsBase, constant, prefixed

ENVD_PORT = 49983


class ProxySettings(SettingsBase):
    model_config = prefixed("proxy")

    host: str = Field(
        default="127.0.0.1", validation_alias=AliasChoices("TORPOR_PROXY_HOST", "TORPOR_HOST")
    )
    """Listen address (`TORPOR_PROXY_HOST` wins)."""
    port: int = Field(
        default=3001,
        ge=0,
        le=65535,
        validation_alias=AliasChoices("TORPOR_PROXY_PORT", "TORPOR_PORT"),
    )
    """Listen port; `/health`, `/livez`, `/readyz` and `/metrics` are on it."""
    touch_interval: float = constant(5.0, ge=0.0)
    """Seconds. Proxied traffic counts as activity: at most one touch per sandbox per interval,
    per replica."""
    resume_wait: float = constant(90.0, gt=0)
    """Seconds a request waits for its sandbox to auto-resume or finish creating."""
    connect_timeout: float = constant(5.0, gt=0)
    """Seconds to connect upstream (the pod)."""
    boot_grace: float = constant(30.0, ge=0)
    """Seconds after a resume during which "connection refused" is retried with backoff, while
    replayed processes start listening."""
    public_ports: bool = True
    """User ports need no token (E2B's default). `false`: every port needs the sandbox's
    `X-Access-Token`. A sandbox created with `network.allowPublicTraffic: false` needs its
    `e2b-traffic-access-token` whatever this says."""
    anonymous_wake: bool = True
    """Whether a request with no valid credential may auto-resume a paused sandbox through a
    public port (E2B's default: yes). `false`: 502 "not running" until a credentialed request
    or the API resumes it."""
    max_connections: int = constant(32, ge=1)
    """Concurrent upstream HTTP exchanges per sandbox port; more requests queue here instead of
    overflowing a small accept backlog in the sandbox (Python's http.server listens with a
    backlog of 5; overflowed handshakes stall for minutes)."""
    max_body_bytes: int = constant(1024**3, ge=1024)
    """Largest body forwarded into a sandbox (file uploads to the daemon included); more is 413.
    Checked after the proxy's own authorisation, so an unauthorised body is 401 unread."""
    body_timeout: float = constant(900.0, gt=0)
    """Seconds for a whole proxied request body to arrive; later is 408."""
