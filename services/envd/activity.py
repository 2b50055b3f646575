"""Activity inside the sandbox, for the control plane's idle timeout (``GET /activity``).

The scheduler asks when the sandbox's inactivity deadline is near; which of these signals count
is the template's policy (docs/lifecycle-hooks.md § activity), not the daemon's:

- ``cpu``: the sandbox's processes (the daemon's own excluded) used at least ``BUSY_CPU`` of one
  CPU over a sampling interval (``INTERVAL`` s);
- ``output``: a process started through the daemon wrote to its stdout, stderr or terminal;
- ``connections``: an outbound TCP connection is established (its local port is no listening
  socket's, so connections *to* the sandbox — the proxy's, the daemon's own — do not count), to a
  non-loopback address;
- ``keepalive``: someone inside touched ``KEEPALIVE_FILE`` (any user may: it is in ``/tmp``) or
  called ``POST /keepalive`` on the daemon.

Times are unix seconds (the daemon's clock; pod and control plane share the node's). ``None``:
not seen since the daemon started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import Any

from services.envd.telemetry import _proc_table, _sandbox_top, _tree

INTERVAL = 5.0
BUSY_CPU = 0.05  # of one CPU, averaged over an interval
KEEPALIVE_FILE = "/tmp/.torpor-keepalive"  # noqa: S108 - only its mtime is read
_TICKS = os.sysconf("SC_CLK_TCK")
_ESTABLISHED, _LISTEN = "01", "0A"

log = logging.getLogger("envd.activity")


class Activity:
    def __init__(self, *, keepalive_file: str = KEEPALIVE_FILE) -> None:
        self.cpu: float | None = None
        self.output: float | None = None
        self.keepalive: float | None = None
        self._keepalive_file = keepalive_file
        self._last: tuple[float, int] | None = None

    def saw_output(self) -> None:
        self.output = time.time()

    def kept_alive(self) -> None:
        self.keepalive = time.time()

    def sample_cpu(self) -> None:
        table = _proc_table()
        me = os.getpid()
        top = _sandbox_top()
        pids = [p for p in _tree(table, top) if p not in (me, top)]
        ticks = sum(table[p][1] for p in pids if p in table)
        now = time.monotonic()
        if self._last is not None and now > self._last[0]:
            used = (ticks - self._last[1]) / _TICKS / (now - self._last[0])
            if used >= BUSY_CPU:
                self.cpu = time.time()
        self._last = (now, ticks)

    def connections(self) -> float | None:
        """Now, if an outbound connection is established; else ``None``."""
        return time.time() if outbound_connections() else None

    def keepalive_file(self) -> float | None:
        try:
            return os.stat(self._keepalive_file).st_mtime
        except OSError:
            return None

    def report(self) -> dict[str, Any]:
        keepalive = max((t for t in (self.keepalive, self.keepalive_file()) if t), default=None)
        return {
            "now": time.time(),
            "last": {
                "cpu": self.cpu,
                "output": self.output,
                "connections": self.connections(),
                "keepalive": keepalive,
            },
        }

    async def run(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.sample_cpu)
            except Exception:  # a sampling failure must not end the loop
                log.exception("activity sample failed")
            await asyncio.sleep(INTERVAL)


def _sockets(path: str) -> list[tuple[str, int, str, int, str]]:
    """(local address hex, local port, remote address hex, remote port, state) of a
    /proc/net/tcp{,6} table."""
    out = []
    with contextlib.suppress(OSError), open(path) as fh:
        next(fh, None)
        for line in fh:
            fields = line.split()
            if len(fields) < 4:
                continue
            local, remote, state = fields[1], fields[2], fields[3]
            laddr, _, lport = local.partition(":")
            raddr, _, rport = remote.partition(":")
            with contextlib.suppress(ValueError):
                out.append((laddr, int(lport, 16), raddr, int(rport, 16), state))
    return out


def _loopback(address_hex: str) -> bool:
    if len(address_hex) == 8:  # IPv4, little-endian: 127.x.x.x ends with 7F
        return address_hex.endswith("7F")
    # IPv6 ::1, or ::ffff:127.x.x.x
    return address_hex == "00000000000000000000000001000000" or (
        address_hex.startswith("0000000000000000FFFF0000") and address_hex.endswith("7F")
    )


def outbound_connections(tables: tuple[str, ...] = ("/proc/net/tcp", "/proc/net/tcp6")) -> int:
    sockets = [s for table in tables for s in _sockets(table)]
    listening = {lport for _, lport, _, _, state in sockets if state == _LISTEN}
    return sum(
        1
        for _, lport, raddr, _, state in sockets
        if state == _ESTABLISHED and lport not in listening and not _loopback(raddr)
    )
