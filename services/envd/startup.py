"""A built template's start and ready commands (E2B's ``set_start_cmd(start, ready)``).

The runtime hands them over in the environment (``TORPOR_START_CMD``, ``TORPOR_READY_CMD``,
``TORPOR_START_USER``, ``TORPOR_START_CWD``); the daemon takes them out before starting any
process. The start command runs once per sandbox as one of its processes (a pause captures it
and a resume replays it like any other: a marker in the sandbox's kept files says it ran); the
ready command runs every half second until it exits 0. Until then ``/health`` answers 503 with
code ``not_ready`` and the last attempt's exit code and output tail (``Readiness.last``): the
runtime tells "still waiting for the ready command" from "daemon down", and when its ready
timeout passes it fails the create with that reason instead of retrying.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field

from services.envd.processes import Exit, Output, ProcessError, ProcessSpec, ProcessTable
from services.envd.users import Identity, UnknownUser, Users

log = logging.getLogger("envd")

ENV_START = "TORPOR_START_CMD"
ENV_READY = "TORPOR_READY_CMD"
ENV_USER = "TORPOR_START_USER"
ENV_CWD = "TORPOR_START_CWD"
STARTED_MARKER = "/var/lib/torpor/start-cmd.started"
READY_INTERVAL = 0.5
READY_ATTEMPT_TIMEOUT = 30.0
LAST_OUTPUT_CHARS = 300


@dataclass
class Readiness:
    """``done`` once the ready command exited 0; ``last``: why it has not yet (for /health)."""

    done: asyncio.Event = field(default_factory=asyncio.Event)
    last: str = "ready command has not run yet"


@dataclass(frozen=True)
class Startup:
    start_cmd: str | None
    ready_cmd: str | None
    user: str | None
    cwd: str | None

    @classmethod
    def take_from_environ(cls) -> Startup | None:
        values = [os.environ.pop(name, None) for name in (ENV_START, ENV_READY, ENV_USER, ENV_CWD)]
        start, ready, user, cwd = values
        if not start and not ready:
            return None
        return cls(start_cmd=start or None, ready_cmd=ready or None, user=user, cwd=cwd)


async def run(startup: Startup, table: ProcessTable, users: Users, ready: Readiness) -> None:
    try:
        identity = users.resolve(startup.user or None)
    except UnknownUser as e:
        log.error("start command: %s", e)
        ready.last = f"start user: {e}"
        return
    if startup.start_cmd and not os.path.exists(STARTED_MARKER):
        try:
            proc, sub = table.start(
                ProcessSpec(
                    cmd="/bin/bash",
                    args=["-l", "-c", startup.start_cmd],
                    envs={},
                    cwd=startup.cwd,
                    user=identity,
                ),
                timeout=None,
            )
            proc.unsubscribe(sub)
            with contextlib.suppress(OSError):
                os.makedirs(os.path.dirname(STARTED_MARKER), exist_ok=True)
                with open(STARTED_MARKER, "w") as f:
                    f.write(str(proc.pid))
            log.info("start command running (pid %d)", proc.pid)
        except ProcessError as e:
            log.error("start command did not start: %s", e)
    if not startup.ready_cmd:
        ready.done.set()
        return
    attempt = 0
    while True:
        attempt += 1
        code, output = await _once(startup.ready_cmd, table, identity, startup.cwd)
        if code == 0:
            log.info("ready command succeeded (attempt %d)", attempt)
            ready.done.set()
            return
        ready.last = describe_attempt(code, output)
        if attempt == 1 or attempt % 20 == 0:
            # Into the pod's log: a create that times out shows why.
            log.warning("ready command not yet: exit %s: %s", code, output[-300:])
        await asyncio.sleep(READY_INTERVAL)


async def _once(
    command: str, table: ProcessTable, identity: Identity, cwd: str | None
) -> tuple[int | None, str]:
    try:
        proc, sub = table.start(
            ProcessSpec(cmd="/bin/bash", args=["-c", command], envs={}, cwd=cwd, user=identity),
            timeout=READY_ATTEMPT_TIMEOUT,
        )
    except ProcessError as e:
        return None, str(e)
    output = b""
    try:
        while True:
            item = await sub.next(READY_ATTEMPT_TIMEOUT + 5)
            if isinstance(item, Output):
                output = (output + item.data)[-2000:]
            elif isinstance(item, Exit):
                return item.exit_code, output.decode(errors="replace")
            elif item is None:
                return None, output.decode(errors="replace")
            else:
                return None, str(item)
    except TimeoutError:
        return None, "timed out"
    finally:
        proc.unsubscribe(sub)


def describe_attempt(code: int | None, output: str) -> str:
    """One failed ready attempt for /health: its exit code and the tail of its output."""
    status = "no exit code" if code is None else f"exit {code}"
    tail = output.replace("\x00", "").strip()[-LAST_OUTPUT_CHARS:]
    return f"ready command failed: {status}" + (f": {tail}" if tail else "")
