"""A minimal loopback HTTP GET for readiness probes (the CLI does not import an HTTP client)."""

from __future__ import annotations

import asyncio
import contextlib


async def http_status(host: str, port: int, path: str, *, within: float = 1.0) -> int | None:
    """The status code of ``GET path``, or ``None`` if nothing answered."""
    writer: asyncio.StreamWriter | None = None
    try:
        reader, opened = await asyncio.wait_for(asyncio.open_connection(host, port), within)
        writer = opened
        opened.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        await opened.drain()
        line = await asyncio.wait_for(reader.readline(), within)
        parts = line.split()
        return int(parts[1]) if len(parts) >= 2 else None
    except (OSError, TimeoutError, ValueError):
        return None
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
