"""How ``torpor sandbox`` shows sandboxes, snapshots and events: rich tables and short times."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from rich.table import Table

if TYPE_CHECKING:
    from services.cli.api_client import RemoteEvent, RemoteSandbox


def span(seconds: float) -> str:
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def ago(at: datetime | None) -> str:
    return "-" if at is None else span((datetime.now(UTC) - at).total_seconds()) + " ago"


def until(at: datetime | None) -> str:
    if at is None:
        return "-"
    delta = (at - datetime.now(UTC)).total_seconds()
    return f"in {span(delta)}" if delta >= 0 else f"{span(-delta)} ago"


STATE_STYLE = {
    "running": "green",
    "paused": "blue",
    "pausing": "yellow",
    "resuming": "yellow",
    "creating": "yellow",
    "failed": "red",
    "killing": "red",
    "killed": "red",
}


def state(state: str) -> str:
    return f"[{STATE_STYLE.get(state, 'white')}]{state}[/]"


def sandboxes_table(items: list[RemoteSandbox]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("NAME", "OWNER", "STATE", "TEMPLATE", "AGE", "DEADLINE", "SNAPSHOT"):
        table.add_column(column, no_wrap=True)
    for s in items:
        snap = f"{s.snapshot.process_count} proc" if s.snapshot else "-"
        table.add_row(
            s.name,
            s.owner,
            state(s.state),
            s.template,
            span((datetime.now(UTC) - s.created_at).total_seconds()),
            until(s.deadline),
            snap,
        )
    return table


def snapshot_table(sandbox: RemoteSandbox) -> Table | None:
    from shared.models.snapshots import Snapshot

    if sandbox.snapshot is None:
        return None
    try:
        snap = Snapshot.decode(sandbox.snapshot.annotation)
    except ValueError:
        return None
    table = Table(
        title=f"snapshot captured {snap.captured_time}",
        title_justify="left",
        box=None,
        header_style="bold",
        pad_edge=False,
    )
    for column in ("PID", "CMD", "ARGS", "CWD", "TAG"):
        table.add_column(column, overflow="fold")
    for p in snap.processes:
        table.add_row(
            str(p.pid), p.config.cmd, json.dumps(p.config.args), p.config.cwd or "", p.tag or ""
        )
    if not snap.processes:
        table.add_row("-", "(no processes were running)", "", "", "")
    return table


def detail_tables(sandbox: RemoteSandbox) -> list[Table]:
    """The sandbox's fields, then its last snapshot (decoded) if it has one."""
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    rows: list[tuple[str, str]] = [
        ("name", sandbox.name),
        ("sandbox id", sandbox.sandbox_id or sandbox.name),
        ("owner", sandbox.owner),
        ("state", state(sandbox.state)),
        ("template", sandbox.template),
        ("timeout", f"{sandbox.timeout}s"),
        ("auto pause", "yes" if sandbox.auto_pause else "no"),
        ("auto resume", "yes" if sandbox.auto_resume else "no"),
        ("created", f"{sandbox.created_at:%Y-%m-%d %H:%M:%S}Z ({ago(sandbox.created_at)})"),
        ("deadline", until(sandbox.deadline)),
    ]
    if sandbox.paused_at is not None:
        rows.append(("paused", ago(sandbox.paused_at)))
    if sandbox.retain_until is not None:
        rows.append(("kept until", f"{sandbox.retain_until:%Y-%m-%d %H:%M:%S}Z"))
    if sandbox.failure:
        rows.append(("last failure", sandbox.failure))
    rows.extend((f"metadata.{k}", v) for k, v in sorted(sandbox.metadata.items()))
    for key, value in rows:
        table.add_row(key, value)
    snap = snapshot_table(sandbox)
    return [table] if snap is None else [table, snap]


def event_details(event: RemoteEvent) -> str:
    skip = {"type", "sandbox_id", "schema_version", "at"}
    parts = []
    for key, value in event.data.items():
        if key in skip:
            continue
        shown = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        parts.append(f"{key}={shown}")
    return " ".join(parts)


def events_table(events: list[RemoteEvent]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("SEQ", justify="right", no_wrap=True)
    table.add_column("TIME (UTC)", no_wrap=True)
    table.add_column("EVENT", no_wrap=True)
    table.add_column("DETAILS", overflow="fold")
    for e in events:
        at = f"{e.at.astimezone(UTC):%Y-%m-%d %H:%M:%S}" if e.at else "-"
        table.add_row(str(e.seq or "-"), at, e.fact, event_details(e))
    return table
