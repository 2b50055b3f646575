"""The HTTP side of a delivery: POST the signed body to the address the policy checked.

The request goes to that IP (``Host`` and TLS SNI name the URL's host), so a name that resolves
elsewhere between the check and the connection (DNS rebinding) cannot redirect it. No redirects
are followed (a 3xx is a failed attempt), no proxy from the environment is used, and the answer's
body is never read.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from shared.webhooks.addresses import Target


class DeliveryFailed(Exception):
    """The attempt did not get an HTTP status (the reason holds no URL and no secret)."""


@dataclass(frozen=True)
class Answer:
    status: int


def _ip_url(target: Target, address: str) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{target.scheme}://{host}:{target.port}{target.path}"


class HttpTransport:
    def __init__(self, *, timeout: float) -> None:
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout),
            follow_redirects=False,
            trust_env=False,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
        )

    async def post(
        self, target: Target, address: str, body: bytes, headers: dict[str, str]
    ) -> Answer:
        extensions = {}
        if target.scheme == "https":
            extensions["sni_hostname"] = target.host
        try:
            async with self._client.stream(
                "POST",
                _ip_url(target, address),
                content=body,
                headers={**headers, "Host": target.host_header},
                extensions=extensions,
            ) as response:
                return Answer(status=response.status_code)
        except httpx.TimeoutException:
            raise DeliveryFailed("timed out") from None
        except httpx.HTTPError as e:
            raise DeliveryFailed(f"connection failed ({type(e).__name__})") from None

    async def close(self) -> None:
        await self._client.aclose()
