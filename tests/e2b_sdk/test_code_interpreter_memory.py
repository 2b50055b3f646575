"""A code-interpreter-v1 sandbox paused with its memory (the unmodified SDK's
``pause(mode="full")``, local runtime with CRIU) comes back with its kernels as they were: the
python, javascript, r, java and bash kernels' variables, the execution server's contexts, and
the next execution counts on. A plain pause replays the server instead (tests/e2b_sdk/test_code_interpreter.py)."""

from __future__ import annotations

from typing import Any

import pytest
from e2b_code_interpreter import Sandbox

from tests.conftest import skip_or_fail
from tests.support.stack import Stack

pytestmark = pytest.mark.slow


# Each kernel's own variable: set before the pause, read (+ 1) after it.
LANGUAGES = {
    "javascript": ("let kept = 41;", "kept + 1", "42"),
    "r": ("kept <- 41", "kept + 1", "[1] 42"),
    "java": ("int kept = 41;", "kept + 1", "42"),
}


def _report(stack: Stack, sid: str) -> dict[str, Any]:
    with stack.client("alice") as api:
        report: dict[str, Any] = api.get(f"/api/v1/sandbox/{sid}").json()["lastResume"]
    return report


def test_a_memory_pause_keeps_the_kernels_variables(stack: Stack) -> None:
    opts = stack.sdk_opts()
    s = Sandbox.create(timeout=300, **opts)
    try:
        s.run_code("import secrets\nx = 41\ntoken = secrets.token_hex(16)")
        token = s.run_code("token").text
        bash = s.create_code_context(language="bash")
        s.run_code("export KEPT_IN_BASH=yes", context=bash)
        others = {lang: s.create_code_context(language=lang) for lang in LANGUAGES}
        for lang, ctx in others.items():
            s.run_code(LANGUAGES[lang][0], context=ctx)
        before = s.run_code("x").execution_count
        s.pause(mode="full")

        again = Sandbox.connect(s.sandbox_id, **opts)
        report = _report(stack, s.sandbox_id)
        if not report["memoryKept"] and "CRIU is not usable" in (report["memoryNote"] or ""):
            skip_or_fail(report["memoryNote"])
        assert report["memoryKept"] is True and report["memoryNote"] is None, report["memoryNote"]
        assert again.run_code("x + 1").text == "42"
        assert again.run_code("token").text == token  # the same kernel, not a new one
        after = again.run_code("x")
        assert after.execution_count is not None and before is not None
        assert after.execution_count > before
        assert [c.id for c in again.list_code_contexts() if c.id == bash.id] == [bash.id]
        out = again.run_code("echo $KEPT_IN_BASH", context=bash)
        assert out.logs.stdout == ["yes\n"], out
        assert again.run_code("y = x * 2\ny").text == "82"  # and it still computes
        for lang, ctx in others.items():
            _, code, value = LANGUAGES[lang]
            got = again.run_code(code, context=ctx)
            assert got.error is None and [r.text for r in got.results] == [value], (lang, got)
    finally:
        Sandbox.kill(s.sandbox_id, **opts)
