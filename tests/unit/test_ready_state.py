"""How the daemon says "still waiting for the ready command" and how the local runtime reads it:
distinct from "daemon down", so a never-ready create fails with the reason (not retried)."""

from __future__ import annotations

import json

import pytest

from services.envd.startup import LAST_OUTPUT_CHARS, describe_attempt
from shared.runtime.readiness import not_ready_reason

pytestmark = pytest.mark.unit


def test_attempt_names_exit_code_and_output_tail() -> None:
    assert describe_attempt(3, "not yet\n") == "ready command failed: exit 3: not yet"
    assert describe_attempt(None, "") == "ready command failed: no exit code"
    long = describe_attempt(1, "x" * 10_000 + "END\x00")
    assert long.endswith("END") and "\x00" not in long
    assert len(long) <= len("ready command failed: exit 1: ") + LAST_OUTPUT_CHARS


def _body(code: object, message: object) -> bytes:
    return json.dumps({"code": code, "message": message}).encode()


def test_only_the_daemons_not_ready_answer_counts_as_waiting() -> None:
    assert not_ready_reason(503, _body("not_ready", "ready command failed: exit 3")) == (
        "ready command failed: exit 3"
    )
    # down, other errors, a proxy's page or hostile bodies: not "waiting", keep retrying
    assert not_ready_reason(503, _body("unavailable", "not ready")) is None
    assert not_ready_reason(502, _body("not_ready", "x")) is None
    assert not_ready_reason(503, b"<html>bad gateway</html>") is None
    assert not_ready_reason(503, b"\x00\xff") is None
    assert not_ready_reason(503, b'["not_ready"]') is None
    assert not_ready_reason(503, _body("not_ready", {"--ro-bind": 1})) == "ready command failed"
    assert len(not_ready_reason(503, _body("not_ready", "y" * 100_000)) or "") == 500
