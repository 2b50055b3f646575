"""The code-interpreter server's message collection (services/interpreter/execution.py) fed the
IOPub order Deno's kernel sometimes publishes: the cell's execute_result after its ``idle``. A
kernel with late outputs reads on for the grace period and delivers that result before the end; a
message of another execution is not delivered; without the grace (python's kernel) the end comes
at idle, as before."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from services.interpreter.execution import LATE_RESULT_GRACE, Execution, dispatch
from services.interpreter.outputs import Output

pytestmark = pytest.mark.unit

CELL = "cell-1"


def _msg(kind: str, parent: str = CELL, **content: Any) -> dict[str, Any]:
    return {"msg_type": kind, "parent_header": {"msg_id": parent}, "content": content}


def _status(state: str, parent: str = CELL) -> dict[str, Any]:
    return _msg("status", parent, execution_state=state)


def _result(text: str, parent: str = CELL) -> dict[str, Any]:
    return _msg("execute_result", parent, data={"text/plain": text}, execution_count=1)


def _stdout(text: str) -> dict[str, Any]:
    return _msg("stream", name="stdout", text=text)


START = [_status("busy"), _msg("execute_input", execution_count=1)]


async def _collect(execution: Execution, timeout: float = 5.0) -> list[Output]:
    """The execution's outputs up to and with its end."""
    found: list[Output] = []
    while not found or found[-1]["type"] != "end_of_execution":
        found.append(await asyncio.wait_for(execution.queue.get(), timeout))
    return found


def _types(found: list[Output]) -> list[str]:
    return [o["type"] for o in found]


async def test_a_result_after_idle_is_delivered_before_the_end() -> None:
    execution = Execution(silent=False, late_grace=LATE_RESULT_GRACE)
    executions = {CELL: execution}
    for msg in [*START, _msg("execute_reply", status="ok"), _status("idle")]:
        dispatch(executions, msg)
    assert not execution.finished.is_set()  # still reading: the result may trail the idle
    await asyncio.sleep(LATE_RESULT_GRACE / 4)
    dispatch(executions, _stdout("late\n"))
    dispatch(executions, _result("'/home/user'"))
    found = await _collect(execution)
    assert _types(found) == ["number_of_executions", "stdout", "result", "end_of_execution"]
    assert found[2]["text"] == "/home/user"
    assert found[2]["is_main_result"] is True
    dispatch(executions, _stdout("after the end\n"))
    assert execution.queue.empty()


async def test_the_late_result_ends_the_execution_at_once() -> None:
    execution = Execution(silent=False, late_grace=30.0)
    executions = {CELL: execution}
    for msg in [*START, _status("idle")]:
        dispatch(executions, msg)
    began = time.monotonic()
    dispatch(executions, _result("42"))
    found = await _collect(execution, timeout=1.0)
    assert _types(found) == ["number_of_executions", "result", "end_of_execution"]
    assert time.monotonic() - began < 1.0


async def test_a_result_of_another_execution_is_not_delivered() -> None:
    execution = Execution(silent=False, late_grace=LATE_RESULT_GRACE)
    executions = {CELL: execution}
    for msg in [*START, _status("idle")]:
        dispatch(executions, msg)
    began = time.monotonic()
    dispatch(executions, _result("'other'", parent="cell-0"))
    dispatch(executions, _stdout("other\n") | {"parent_header": {"msg_id": "cell-0"}})
    found = await _collect(execution)
    assert _types(found) == ["number_of_executions", "end_of_execution"]
    assert time.monotonic() - began >= LATE_RESULT_GRACE * 0.9  # it waited the grace out


async def test_a_result_before_idle_ends_at_idle() -> None:
    execution = Execution(silent=False, late_grace=30.0)
    executions = {CELL: execution}
    for msg in [*START, _result("1"), _status("idle")]:
        dispatch(executions, msg)
    assert execution.finished.is_set()
    found = await _collect(execution, timeout=0.1)
    assert _types(found) == ["number_of_executions", "result", "end_of_execution"]


async def test_without_the_grace_the_end_is_at_idle_and_a_late_result_is_lost() -> None:
    execution = Execution(silent=False)  # python's and bash's kernels
    executions = {CELL: execution}
    for msg in [*START, _status("idle"), _result("42")]:
        dispatch(executions, msg)
    found = await _collect(execution, timeout=0.1)
    assert _types(found) == ["number_of_executions", "end_of_execution"]


async def test_a_silent_snippet_ends_at_idle() -> None:
    execution = Execution(silent=True, late_grace=30.0)
    for msg in [*START, _status("idle")]:
        dispatch({CELL: execution}, msg)
    assert _types(await _collect(execution, timeout=0.1)) == ["end_of_execution"]


async def test_a_restart_during_the_grace_ends_it_once() -> None:
    execution = Execution(silent=False, late_grace=LATE_RESULT_GRACE)
    for msg in [*START, _status("idle")]:
        dispatch({CELL: execution}, msg)
    execution.put({"type": "error", "name": "ContextRestarting", "value": "", "traceback": ""})
    execution.end()
    found = await _collect(execution, timeout=0.1)
    assert _types(found) == ["number_of_executions", "error", "end_of_execution"]
    await asyncio.sleep(LATE_RESULT_GRACE * 1.5)  # the cancelled timer adds no second end
    assert execution.queue.empty()
