"""Which sandbox and port a request is for: ``E2b-Sandbox-Id``/``E2b-Sandbox-Port`` headers
(what the SDK sends behind ``E2B_SANDBOX_URL``) or a ``{port}-{sandboxID}.{domain}`` host."""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.proxy.settings import ENVD_PORT
from shared.domain.record import SandboxRecord
from shared.ids import is_valid_sandbox_id

_HOST_LABEL = re.compile(r"^([0-9]{1,5})-([a-z0-9][a-z0-9-]*)$")
# ASCII digits only: str.isdigit() also accepts "²" or "٣", which int() then refuses.
_PORT = re.compile(r"^[0-9]{1,5}$")


@dataclass(frozen=True)
class Target:
    sandbox_id: str
    port: int

    @property
    def is_daemon(self) -> bool:
        return self.port == ENVD_PORT


class BadTargetError(ValueError):
    """The request names a sandbox, but not in a usable way."""


def _port(raw: str) -> int:
    if not _PORT.match(raw) or not 0 < int(raw) < 65536:
        msg = f"invalid E2b-Sandbox-Port {raw[:16]!r}: a port number 1-65535"
        raise BadTargetError(msg)
    return int(raw)


def target_of(headers: list[tuple[bytes, bytes]]) -> Target | None:
    """The target; ``None`` when the request names no sandbox; ``BadTargetError`` if garbled.
    The first of a repeated routing header counts (tests/proxy/test_repeated_headers.py)."""
    return target_from(
        _first(headers, b"e2b-sandbox-id"),
        _first(headers, b"e2b-sandbox-port"),
        _first(headers, b"host"),
    )


def _first(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def target_from(sandbox_id: bytes | None, port: bytes | None, host: bytes | None) -> Target | None:
    """``target_of`` from the first value of each routing header (``None``: absent). A pure
    function of these three, so the relay reuses its answer while they stay the same."""
    sid = sandbox_id.decode("latin-1").strip() if sandbox_id is not None else ""
    if sid:
        if not is_valid_sandbox_id(sid):
            msg = f"invalid sandbox id {sid[:80]!r}"
            raise BadTargetError(msg)
        raw_port = port.decode("latin-1").strip() if port is not None else ""
        return Target(sid, _port(raw_port) if raw_port else ENVD_PORT)
    name = host.decode("latin-1").strip() if host is not None else ""
    first = name.split(":", 1)[0].split(".", 1)
    if len(first) == 2 and (m := _HOST_LABEL.match(first[0].lower())):
        sid = m.group(2)
        if is_valid_sandbox_id(sid):
            return Target(sid, _port(m.group(1)))
    return None


def upstream_host(record: SandboxRecord) -> str:
    """The address part of a record's ``host`` (``addr:port``; an IPv6 address as it is)."""
    host = record.host or ""
    name, sep, port = host.rpartition(":")
    return name if sep and port.isdigit() and ":" not in name else host
