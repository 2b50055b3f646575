"""One style for log event names: snake_case words (``pod_started``, ``k8s_workload_created``),
no dots, no spaces, no formatting. Every structlog call of the control plane is read from the
source, so a new event in another style fails here, not in a reviewer's eye.

The in-sandbox daemon (``services/envd``) is left out: it ships alone and logs human sentences
through the standard library (no structlog, no event names)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LEVELS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "msg"})
EVENT = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")
SKIP = ("services/envd/",)


@functools.cache
def event_names(path: Path) -> list[tuple[int, str]]:
    """(line, event) of every ``<logger>.<level>("event", ...)`` call in a structlog module."""
    source = path.read_text()
    if "structlog" not in source:
        return []
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in LEVELS
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


@functools.cache
def sources() -> tuple[Path, ...]:
    return tuple(
        p
        for folder in ("services", "shared")
        for p in sorted((REPO / folder).rglob("*.py"))
        if not p.relative_to(REPO).as_posix().startswith(SKIP)
    )


def test_every_log_event_name_is_snake_case() -> None:
    bad = [
        f"{path.relative_to(REPO)}:{line}: {name!r}"
        for path in sources()
        for line, name in event_names(path)
        if not EVENT.fullmatch(name)
    ]
    assert bad == [], "log event names must be snake_case:\n" + "\n".join(bad)


def test_the_scan_sees_the_log_calls() -> None:
    """The check cannot pass by reading nothing: it finds the events it is known to guard."""
    names = {name for path in sources() for _, name in event_names(path)}
    assert len(names) > 50
    assert {"resume_timing", "bus_anonymous_access", "k8s_workload_created"} <= names
    assert not EVENT.fullmatch("runtime.local.pod_started")
    assert not EVENT.fullmatch("metrics sample failed")
