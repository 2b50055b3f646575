"""The code-interpreter server's nudge (services/interpreter/contexts.py, ``NUDGE_AFTER``): after a
memory restore a kernel can leave an execute request unread until another message arrives on its
channels. A request the kernel has not started gets kernel_info requests behind it until it
starts; one the kernel starts at once gets none. The kernel here is a fake client that starts a
request only when (or if) it is nudged; the outputs go through the server's own dispatch."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from services.interpreter import contexts
from services.interpreter.contexts import Context
from services.interpreter.execution import dispatch
from services.interpreter.languages import LANGUAGES

pytestmark = pytest.mark.unit


class _Kernel:
    """A kernel client: ``execute`` queues the request; it runs (busy, input, stream, reply,
    idle) at once when ``prompt``, else only once a kernel_info request arrives behind it."""

    def __init__(self, context: Context, *, prompt: bool) -> None:
        self.context = context
        self.prompt = prompt
        self.pending: list[str] = []
        self.nudges = 0
        self._ids = itertools.count(1)

    def execute(self, code: str, **_: Any) -> str:
        msg_id = f"req-{next(self._ids)}"
        self.pending.append(msg_id)
        if self.prompt:
            asyncio.get_running_loop().call_soon(self._run_pending)
        return msg_id

    def kernel_info(self) -> str:
        self.nudges += 1
        asyncio.get_running_loop().call_soon(self._run_pending)
        return f"info-{self.nudges}"

    def _run_pending(self) -> None:
        while self.pending:
            parent = self.pending.pop(0)
            for kind, content in (
                ("status", {"execution_state": "busy"}),
                ("execute_input", {"execution_count": 1}),
                ("stream", {"name": "stdout", "text": "ran\n"}),
                ("execute_reply", {"status": "ok"}),
                ("status", {"execution_state": "idle"}),
            ):
                msg = {"msg_type": kind, "parent_header": {"msg_id": parent}, "content": content}
                dispatch(self.context._executions, msg)


async def _no_env(_: str | None) -> dict[str, str]:
    return {}


async def _run(kernel: _Kernel, code: str) -> list[dict[str, Any]]:
    found = []
    async for item in kernel.context.run(code, {}, None):
        found.append(dict(item))
    return found


def _context(monkeypatch: pytest.MonkeyPatch, *, prompt: bool) -> _Kernel:
    monkeypatch.setattr(contexts, "NUDGE_AFTER", 0.05)
    context = Context(LANGUAGES["bash"], "/", _no_env)
    kernel = _Kernel(context, prompt=prompt)
    context._kc = kernel
    return kernel


async def test_a_request_the_kernel_left_unread_is_nudged_until_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel = _context(monkeypatch, prompt=False)
    found = await asyncio.wait_for(_run(kernel, "echo ran"), 5)
    assert kernel.nudges >= 1
    assert [o["type"] for o in found] == ["number_of_executions", "stdout"]  # then the end
    assert found[1]["text"] == "ran\n"


async def test_a_request_the_kernel_runs_at_once_is_not_nudged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel = _context(monkeypatch, prompt=True)
    for _ in range(3):
        found = await asyncio.wait_for(_run(kernel, "echo ran"), 5)
        assert [o["type"] for o in found] == ["number_of_executions", "stdout"]
    await asyncio.sleep(contexts.NUDGE_AFTER * 4)  # every nudge task has looked and ended
    assert kernel.nudges == 0
    assert not [t for t in contexts._BACKGROUND if not t.done()]


async def test_the_nudges_stop_after_their_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = _context(monkeypatch, prompt=False)
    monkeypatch.setattr(contexts, "NUDGES", 3)
    kernel.kernel_info = lambda: _count(kernel)  # type: ignore[method-assign]  # a kernel that never wakes
    context = kernel.context
    _, execution = context._send("never", silent=False)
    await asyncio.sleep(contexts.NUDGE_AFTER * 6)
    assert kernel.nudges == 3
    assert not execution.started


def _count(kernel: _Kernel) -> str:
    kernel.nudges += 1
    return "info"
