"""Which URLs a webhook may have, and which addresses a delivery may connect to.

A delivery is a request torpor makes on a user's behalf, from inside the control plane: without
these rules a webhook URL would reach the control plane's own API, NATS, metrics or a sandbox's
daemon (SSRF). The rules, checked at registration AND again at every delivery (the name may
resolve elsewhere by then: DNS rebinding), and the delivery connects to the address it checked:

- ``http``/``https`` only, no credentials in the URL, no fragment, ASCII host, at most 2048
  characters, no control characters or spaces;
- every address the host resolves to must be public (globally routable), unless it lies in a
  range the operator opened (``TORPOR_WEBHOOKS_ALLOW_CIDRS``, e.g. ``10.20.0.0/16`` for an
  internal receiver, or ``127.0.0.0/8`` on a laptop);
- on any address that is not public (where the control plane itself lives), the control plane's
  ports stay refused even inside an opened range (``WebhookPolicySettings.control_ports``, plus the
  ports ``torpor up`` gives its services);
- ranges in ``TORPOR_WEBHOOKS_DENY_CIDRS`` (e.g. the control plane's public addresses) are
  refused whatever the port.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from shared.errors import InvalidInput

MAX_URL_LENGTH = 2048
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# torpor's well-known ports: API, proxy, NATS (client, cluster, monitoring), the services' health
# and metrics ports, the in-sandbox daemon.
DEFAULT_CONTROL_PORTS: frozenset[int] = frozenset(
    {3000, 3001, 4222, 6222, 8222, 7422, 8080, 8081, 8082, 8083, 8084, 8085, 8086, 8087, 49983}
)


class RefusedUrl(InvalidInput):
    """The URL or an address it resolves to may not receive webhooks (HTTP 400 at registration,
    a dead letter at delivery)."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # lower-case; an IPv6 literal without brackets
    port: int
    path: str  # path and query, as sent

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def parse_url(url: str) -> Target:
    if len(url) > MAX_URL_LENGTH:
        msg = f"url: at most {MAX_URL_LENGTH} characters"
        raise RefusedUrl(msg)
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        msg = "url: control characters and spaces are not allowed"
        raise RefusedUrl(msg)
    if not url.isascii():
        msg = "url: must be ASCII (write an international host name in punycode)"
        raise RefusedUrl(msg)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        msg = f"url: malformed ({e})"
        raise RefusedUrl(msg) from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        msg = "url: only http and https URLs can receive webhooks"
        raise RefusedUrl(msg)
    if "@" in parts.netloc:
        msg = "url: credentials in the URL are not allowed (the signature authenticates torpor)"
        raise RefusedUrl(msg)
    if parts.fragment or url.endswith("#"):
        msg = "url: a fragment is never sent; remove it"
        raise RefusedUrl(msg)
    host = (parts.hostname or "").lower()
    if not host:
        msg = "url: no host"
        raise RefusedUrl(msg)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(scheme, host, port or (443 if scheme == "https" else 80), path)


def networks(values: Iterable[str], *, name: str) -> tuple[IPNetwork, ...]:
    out = []
    for value in values:
        try:
            out.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            msg = f"{name}: {value!r} is not an IP range (e.g. 127.0.0.0/8)"
            raise ValueError(msg) from None
    return tuple(out)


def _plain(ip: IPAddress) -> IPAddress:
    """An IPv4-mapped/compatible IPv6 address as the IPv4 address it really is."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
    return ip


@dataclass(frozen=True)
class AddressPolicy:
    allow: tuple[IPNetwork, ...] = ()
    deny: tuple[IPNetwork, ...] = ()
    control_ports: frozenset[int] = field(default=DEFAULT_CONTROL_PORTS)

    def refusal(self, address: str, port: int) -> str | None:
        """Why a delivery may not connect to ``address:port``; ``None`` if it may."""
        try:
            ip = _plain(ipaddress.ip_address(address.split("%", 1)[0]))
        except ValueError:
            return f"{address!r} is not an IP address"
        if any(ip in net for net in self.deny if net.version == ip.version):
            return f"{ip} belongs to the control plane"
        public = ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_unspecified)
        if public:
            return None
        if not any(ip in net for net in self.allow if net.version == ip.version):
            return (
                f"{ip} is not a public address (an operator may open a range with "
                "TORPOR_WEBHOOKS_ALLOW_CIDRS)"
            )
        if port in self.control_ports:
            return f"port {port} on {ip} is one of the control plane's"
        return None


Resolver = Callable[[str, int], Awaitable[list[str]]]


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def checked_addresses(
    target: Target, policy: AddressPolicy, resolver: Resolver = system_resolver
) -> list[str]:
    """Every address ``target`` resolves to, all allowed; else ``RefusedUrl`` naming one refused
    (a name with one bad address among good ones is refused: the connection could pick it)."""
    try:
        found = await asyncio.wait_for(resolver(target.host, target.port), 10)
    except (OSError, TimeoutError, UnicodeError) as e:
        msg = f"url: cannot resolve the host ({type(e).__name__})"
        raise RefusedUrl(msg) from None
    if not found:
        msg = "url: the host resolves to no address"
        raise RefusedUrl(msg)
    for address in found:
        if (why := policy.refusal(address, target.port)) is not None:
            msg = f"url: refused: {why}"
            raise RefusedUrl(msg)
    return found
