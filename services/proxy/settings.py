"""Settings of the sandbox proxy (``TORPOR_PROXY_*``)."""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from shared.settings import _Base

ENVD_PORT = 49983


class ProxySettings(_Base):
    model_config = SettingsConfigDict(frozen=True, extra="ignore", env_prefix="TORPOR_PROXY_")

    # ``torpor up`` hands each public service TORPOR_HOST/TORPOR_PORT; TORPOR_PROXY_* wins.
    host: str = Field(
        default="127.0.0.1", validation_alias=AliasChoices("TORPOR_PROXY_HOST", "TORPOR_HOST")
    )
    port: int = Field(
        default=3001,
        ge=0,
        le=65535,
        validation_alias=AliasChoices("TORPOR_PROXY_PORT", "TORPOR_PORT"),
    )
    # Proxied traffic is activity: at most one ``touch`` per sandbox per this many seconds, per
    # replica (a KV write and an event each).
    touch_interval: float = Field(default=5.0, ge=0.0)
    # How long a request may wait for its sandbox to (auto-)resume or finish creating.
    resume_wait: float = Field(default=90.0, gt=0)
    connect_timeout: float = Field(default=5.0, gt=0)
    # A replayed process needs a moment to listen again: after a resume, "connection refused"
    # is retried with backoff for this long before the request gets "port is not open".
    boot_grace: float = Field(default=30.0, ge=0)
    # E2B's default: ports other than the daemon's are reachable without a token. Set to false
    # to require the sandbox's X-Access-Token on every port.
    public_ports: bool = True
    # TORPOR_PROXY_ANONYMOUS_WAKE: whether a request without any credential (no owner API key,
    # envd token or traffic token) may auto-resume a paused sandbox through a public port.
    # E2B's behaviour is yes. A sandbox with allowPublicTraffic=false never serves anonymous
    # requests, so they can neither wake nor extend it.
    anonymous_wake: bool = True
    # TORPOR_PROXY_MAX_CONNECTIONS: concurrent upstream HTTP exchanges per sandbox port; more
    # requests queue here instead of overflowing a small accept backlog in the sandbox (Python's
    # http.server listens with a backlog of 5; overflowed handshakes stall for minutes).
    max_connections: int = Field(default=32, ge=1)
    # TORPOR_PROXY_MAX_BODY_BYTES: the largest request body forwarded into a sandbox (file
    # uploads to the daemon included); 413 beyond. TORPOR_PROXY_BODY_TIMEOUT: how long a body
    # may take to arrive in full (408 beyond); pauses are bounded by TORPOR_HTTP_BODY_IDLE_TIMEOUT.
    max_body_bytes: int = Field(default=1024**3, ge=1024)
    body_timeout: float = Field(default=900.0, gt=0)
