"""Reading the in-sandbox daemon's "waiting for the template's ready command" answer.

The daemon's ``/health`` answers 503 with code ``not_ready`` (and the last attempt's exit code
and output, ``services/envd/startup.py``) while a built template's ready command has not yet
succeeded. Both runtimes read it the same way: a pod that is up but whose ready command kept
failing until the ready timeout is ``ReadyFailed`` (no retry heals it), not ``PodNotReady``.
"""

from __future__ import annotations

import json

REASON_CHARS = 500


def not_ready_reason(status: int, body: bytes) -> str | None:
    """The daemon's "ready command not yet" reason from a /health answer, else None."""
    if status != 503:
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("code") != "not_ready":
        return None
    message = data.get("message")
    return message[:REASON_CHARS] if isinstance(message, str) else "ready command failed"
