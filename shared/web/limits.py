"""Settings of the HTTP limits both public services apply (``TORPOR_HTTP_*``).

Body size and body time limits differ per service and live in their own settings
(``TORPOR_MAX_BODY_BYTES`` for the api, ``TORPOR_PROXY_MAX_BODY_BYTES`` for the proxy)."""

from __future__ import annotations

import ipaddress
from functools import cached_property

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from shared.settings import _Base

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class HttpLimits(_Base):
    model_config = SettingsConfigDict(frozen=True, extra="ignore", env_prefix="TORPOR_HTTP_")

    # The request line plus every header, in bytes; more is 431 (and the connection closes).
    max_header_bytes: int = Field(default=16 * 1024, ge=1024, le=1024 * 1024)
    max_headers: int = Field(default=100, ge=8, le=1000)
    # A request's head must be complete this many seconds after its first byte (or after the
    # connection opened): a client that trickles headers gets 408 and is disconnected.
    header_timeout: float = Field(default=10.0, gt=0)
    # The longest pause between two pieces of a request body; more is 408.
    body_idle_timeout: float = Field(default=30.0, gt=0)
    # Open connections per process / per client address; more are answered 503 and closed.
    max_connections: int = Field(default=4096, ge=1)
    max_connections_per_client: int = Field(default=256, ge=1)
    # Requests in progress per client address; more are answered 429 (Retry-After: 1).
    max_requests_per_client: int = Field(default=512, ge=1)
    # Comma-separated addresses or networks of reverse proxies (TLS ingress) whose
    # X-Forwarded-For / X-Forwarded-Proto are believed. Empty: nobody's (the default).
    trusted_proxies: str = ""

    @field_validator("trusted_proxies")
    @classmethod
    def _check_networks(cls, value: str) -> str:
        for item in _items(value):
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                msg = f"not an IP address or network: {item!r}"
                raise ValueError(msg) from None
        return value

    @cached_property
    def trusted_networks(self) -> tuple[Network, ...]:
        return tuple(ipaddress.ip_network(i, strict=False) for i in _items(self.trusted_proxies))

    def is_trusted(self, address: str | None) -> bool:
        if not address or not self.trusted_networks:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self.trusted_networks)


def _items(value: str) -> list[str]:
    return [i.strip() for i in value.split(",") if i.strip()]
