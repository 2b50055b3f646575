"""Settings of the HTTP limits both public services apply (``TORPOR_HTTP_*``).

Body size and body time limits differ per service and live in their own settings
(``ApiSettings.max_body_bytes`` for the api, ``ProxySettings.max_body_bytes`` for the proxy)."""

from __future__ import annotations

import ipaddress
from functools import cached_property

from pydantic import Field, field_validator

from shared.settings import SettingsBase, constant, prefixed

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class HttpLimits(SettingsBase):
    model_config = prefixed("http")

    max_header_bytes: int = constant(16 * 1024, ge=1024, le=1024 * 1024)
    """Request line plus headers, in bytes; more is 431 and the connection closes."""
    max_headers: int = constant(100, ge=8, le=1000)
    """Headers per request; more is 431."""
    header_timeout: float = constant(10.0, gt=0)
    """Seconds from a connection's opening (or a request's first byte) until its head is
    complete; later is 408 and the connection closes."""
    body_idle_timeout: float = constant(30.0, gt=0)
    """Longest pause, in seconds, between two pieces of a request body; longer is 408."""
    max_connections: int = Field(default=4096, ge=1)
    """Open connections per process; more are answered 503 and closed."""
    max_connections_per_client: int = constant(256, ge=1)
    """Open connections per client address (not counted for trusted proxies, nor once upgraded
    to WebSocket); more are 503."""
    max_requests_per_client: int = constant(512, ge=1)
    """Requests in progress per client address (per process); more are 429 with `Retry-After:
    1`."""
    trusted_proxies: str = ""
    """Comma-separated addresses/networks of reverse proxies (a TLS ingress) whose
    `X-Forwarded-For` and `X-Forwarded-Proto` are believed: the client address then comes from
    `X-Forwarded-For` (per-client limits, logs) and the scheme from `X-Forwarded-Proto` (the
    dashboard cookie's `Secure`). Empty: forwarded headers are ignored."""

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
