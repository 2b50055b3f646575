"""One execution's kernel messages collected into its outputs (``services.interpreter.outputs``),
``end_of_execution`` last: what the kernel publishes for it on IOPub, its ``execute_reply`` on the
shell channel. No kernel, no I/O (``services.interpreter.contexts`` reads the channels)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.interpreter import outputs
from services.interpreter.outputs import Output

# Deno's kernel does not order a cell's outputs (stream, display_data, execute_result) before its
# `idle` status: about 1 cell in 10 has them reach IOPub after it. An execution of such a kernel
# without its execute_result yet reads on for this long (and ends as soon as the result comes).
LATE_RESULT_GRACE = 0.2


@dataclass
class Execution:
    silent: bool
    late_grace: float = 0.0  # LATE_RESULT_GRACE for a kernel whose outputs may trail its idle
    queue: asyncio.Queue[Output] = field(default_factory=asyncio.Queue)
    started: bool = False
    errored: bool = False
    main_result: bool = False
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    _grace: asyncio.TimerHandle | None = None

    def put(self, output: Output) -> None:
        if not self.finished.is_set():
            self.queue.put_nowait(output)

    def end(self) -> None:
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        if not self.finished.is_set():
            self.queue.put_nowait(outputs.END)
            self.finished.set()

    def idle(self) -> None:
        """The kernel is idle again: the end, at once or after the grace period."""
        if self.silent or self.main_result or self.late_grace <= 0:
            self.end()
        elif self._grace is None and not self.finished.is_set():
            self._grace = asyncio.get_running_loop().call_later(self.late_grace, self.end)

    def main_result_seen(self) -> None:
        self.main_result = True
        if self._grace is not None:  # the late result came: nothing more to wait for
            self.end()


def dispatch(executions: Mapping[str, Execution], msg: dict[str, Any]) -> None:
    """A kernel message to the execution it answers (its parent's msg_id); others are dropped."""
    parent = msg.get("parent_header", {}).get("msg_id")
    execution = executions.get(parent) if parent else None
    if execution is None:
        return
    kind = msg.get("msg_type")
    content = msg.get("content", {})
    if kind == "status":
        state = content.get("execution_state")
        if state == "busy":
            execution.started = True
        elif state == "idle" and execution.started:
            execution.idle()
        return
    if kind == "execute_input":
        execution.started = True
        if not execution.silent:
            execution.put(outputs.count(int(content.get("execution_count", 0))))
        return
    if kind == "execute_reply":
        status = content.get("status")
        if status == "error" and not execution.errored:
            execution.errored = True
            execution.put(
                outputs.error(
                    str(content.get("ename", "")),
                    str(content.get("evalue", "")),
                    list(content.get("traceback", [])),
                )
            )
        elif status in ("abort", "aborted"):
            execution.put(outputs.error("ExecutionAborted", "Execution was aborted", ""))
            execution.end()
        return
    output = outputs.from_iopub(msg)
    if output is None:
        return
    if output["type"] == "error":
        if execution.errored:
            return
        execution.errored = True
    elif execution.silent:
        return
    execution.put(output)
    if output.get("is_main_result"):
        execution.main_result_seen()
