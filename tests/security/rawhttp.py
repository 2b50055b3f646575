"""Raw HTTP/1.1 over loopback sockets, for clients no HTTP library will impersonate: huge or
many headers, heads and bodies that trickle, bodies announced but never sent."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from shared.bus.server import free_port
from shared.web.limits import HttpLimits
from shared.web.serving import server_config
from tests.support.serving import serve_config


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    return parts.hostname, parts.port


def authority(url: str) -> str:
    host, port = host_port(url)
    return f"{host}:{port}"


def connect(url: str, *, source: str | None = None, timeout: float = 60) -> socket.socket:
    sock = socket.create_connection(
        host_port(url), timeout=timeout, source_address=(source, 0) if source else None
    )
    sock.settimeout(timeout)
    return sock


def read_answer(sock: socket.socket) -> Answer:
    """One response (read until the peer closes or Content-Length is complete)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            msg = f"connection closed before a response head: {data[:200]!r}"
            raise ConnectionError(msg)
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return Answer(status, headers, body[:length])


def read_answers(sock: socket.socket, count: int) -> list[Answer]:
    """``count`` pipelined responses (each framed by Content-Length), in order; fewer if the
    server closes the connection first. (``read_answer`` drops what follows its answer: two
    answers can arrive in one read.)"""
    data = b""
    out: list[Answer] = []
    while len(out) < count:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            lines = data[:end].decode("latin-1").split("\r\n")
            headers = {
                k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])
            }
            size = int(headers.get("content-length", "0"))
            if len(data) >= end + 4 + size:
                body = data[end + 4 : end + 4 + size]
                out.append(Answer(int(lines[0].split()[1]), headers, body))
                data = data[end + 4 + size :]
                continue
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return out


def exchange(url: str, raw: bytes, *, source: str | None = None) -> Answer:
    with connect(url, source=source) as sock:
        sock.sendall(raw)
        return read_answer(sock)


def head(
    method: str, path: str, host: str, headers: dict[str, str] | list[tuple[str, str]]
) -> bytes:
    items = headers.items() if isinstance(headers, dict) else headers
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", *(f"{k}: {v}" for k, v in items)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the server has closed the connection (reads drain any answer first)."""
    try:
        while sock.recv(65536):
            pass
    except (ConnectionResetError, TimeoutError):
        return False
    return True


@contextmanager
def serve_guarded(app: Any, limits: HttpLimits, **extra: Any) -> Iterator[str]:
    """``app`` under uvicorn with the production protocol and limits, on 127.0.0.1."""
    config = server_config(app, limits, host="127.0.0.1", port=free_port(), lifespan="on", **extra)
    with serve_config(config) as url:
        yield url
