"""The second line of defence (shared/redaction.py, the structlog processor): fast unit tier."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest
import structlog

from shared.logging import configure
from shared.models.messages import CreateSandbox, SandboxFailed
from shared.redaction import MASK, redact_any, redact_json_bytes, redact_text
from shared.settings import LoggingSettings

pytestmark = pytest.mark.unit

KEY = "torpor_" + "ab12" * 10
E2B_KEY = "e2b_" + "cd34" * 10
TOKEN = "f00d" * 12  # the daemon token's shape: 48 hex


@pytest.mark.parametrize(
    "text",
    [
        f"Authorization: Bearer {KEY}",
        f"authorization=bearer {TOKEN}",
        f"[(b'authorization', b'Bearer {KEY}'), (b'x-access-token', b'{TOKEN}')]",
        f"{{'X-API-KEY': '{E2B_KEY}', 'x-access-token': '{TOKEN}'}}",
        f"X-Access-Token: {TOKEN}",
        f"e2b-traffic-access-token: {TOKEN}",
        f"the key {KEY} was refused",
        f"nats://api:{TOKEN}@127.0.0.1:4222",
        f'{{"accessToken": "{TOKEN}"}}',
        f"envd_access_token='{TOKEN}' password={TOKEN}",
    ],
)
def test_known_shapes_are_masked(text: str) -> None:
    masked = redact_text(text)
    assert KEY not in masked
    assert E2B_KEY not in masked
    assert TOKEN not in masked
    assert MASK in masked


def test_ordinary_text_is_left_alone() -> None:
    for text in ("sandbox sbx-1 paused", "key id key_0123abcd revoked", "pause: daemon timeout"):
        assert redact_text(text) == text


def test_by_key_env_values_and_secret_fields() -> None:
    event = {
        "envs": {"DB_PASSWORD": "hunter2", "LANG": "C"},
        "envd_access_token": TOKEN,
        "headers": {"x-api-key": KEY, "accept": "*/*"},
        "key_id": "key_123",
        "token_sha256": "ab" * 32,
        "metadata": {"team": "blue"},
    }
    out = redact_any(event)
    assert out["envs"] == {"DB_PASSWORD": MASK, "LANG": MASK}
    assert out["envd_access_token"] == MASK
    assert out["headers"] == {"x-api-key": MASK, "accept": "*/*"}
    assert out["key_id"] == "key_123"
    assert out["token_sha256"] == "ab" * 32
    assert out["metadata"] == {"team": "blue"}


def test_dead_letter_bodies() -> None:
    clean = b'{"sandbox_id": "s1",  "generation": 3}'
    assert redact_json_bytes(clean) == clean  # untouched, byte for byte
    dirty = json.dumps({"sandbox_id": "s1", "envs": {"A": "hunter2"}}).encode()
    assert b"hunter2" not in redact_json_bytes(dirty)
    assert json.loads(redact_json_bytes(dirty))["sandbox_id"] == "s1"
    assert KEY.encode() not in redact_json_bytes(f"not json {KEY}".encode())


def test_create_command_carries_no_env_values() -> None:
    assert "envs" not in CreateSandbox.model_fields
    cmd = CreateSandbox.model_validate(
        {"sandbox_id": "s1", "owner": "alice", "envs": {"DB_PASSWORD": "hunter2"}}
    )
    assert "hunter2" not in cmd.model_dump_json()


def test_failure_reasons_are_masked() -> None:
    event = SandboxFailed.model_validate(
        {
            "sandbox_id": "s1",
            "generation": 1,
            "at": "2026-01-01T00:00:00Z",
            "op": "pause",
            "reason": f"daemon said 401 for X-Access-Token: {TOKEN}",
        }
    )
    assert TOKEN not in event.reason


@pytest.mark.parametrize("fmt", ["console", "json"])
def test_logged_exceptions_show_no_locals_and_no_secrets(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both structlog's own lines and stdlib ones (uvicorn's "Exception in ASGI application")."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    configure(LoggingSettings(log_format=fmt, log_level="info"), service="test")
    try:
        headers = {"authorization": f"Bearer {KEY}"}  # a local of the failing frame
        hidden = TOKEN  # another one, in no message at all
        raise RuntimeError(f"boom with {E2B_KEY}")
    except RuntimeError as e:
        structlog.get_logger().error("unhandled_error", exc_info=e, api_key=KEY)
        logging.getLogger("uvicorn.error").exception("Exception in ASGI application")
    finally:
        structlog.reset_defaults()
        logging.getLogger().handlers.clear()
    del headers, hidden
    text = out.getvalue()
    assert "RuntimeError" in text
    assert "Exception in ASGI application" in text
    for secret in (KEY, E2B_KEY, TOKEN):
        assert secret not in text
