"""What ``torpor up`` shows: a live table on a terminal, plain log lines otherwise."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from services.cli.supervising import Child

_STYLES = {
    "ready": "green",
    "running": "green",
    "starting": "yellow",
    "restarting": "red",
    "not ready": "red",
    "stopping": "yellow",
    "stopped": "dim",
}


def _uptime(seconds: float) -> str:
    if seconds <= 0:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class StatusView:
    def __init__(
        self, *, header: str, nats_pid: int | None, console: Console | None = None
    ) -> None:
        self.header = header
        self.nats_pid = nats_pid
        self.console = console or Console()
        self.interactive = sys.stdout.isatty()

    def render(self, children: Sequence[Child]) -> Group:
        table = Table(title="torpor up", title_justify="left", expand=False)
        for column in ("service", "pid", "state", "restarts", "uptime"):
            table.add_column(column)
        table.add_row("nats", str(self.nats_pid or "-"), Text("ready", style="green"), "0", "")
        for c in children:
            table.add_row(
                c.name,
                str(c.pid or "-") if c.alive else "-",
                Text(c.state, style=_STYLES.get(c.state, "")),
                str(c.restarts),
                _uptime(c.uptime()),
            )
        return Group(Text(self.header), table, Text("Ctrl-C to stop", style="dim"))

    def event(self, event: str, child: Child, detail: str) -> None:
        """Plain one-line log for non-terminals (the live table shows it all otherwise)."""
        if self.interactive:
            return
        self.line(f"{child.name} {event} {detail}".rstrip())

    def line(self, text: str) -> None:
        stamp = datetime.now(UTC).strftime("%H:%M:%S")
        print(f"{stamp} {text}", flush=True)
