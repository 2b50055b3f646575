"""The unmodified e2b SDK against the API's REST surface (fake lifecycle, no sandboxes): every
control-plane call of the seed's example parses and maps as the SDK expects (docs/api.md)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import pytest
from e2b import Sandbox
from e2b.exceptions import AuthenticationException, SandboxNotFoundException

from services.api.app import create_app
from services.api.deps import Wiring
from services.api.settings import ApiSettings
from tests.api.conftest import ALICE, BOB
from tests.api.fakes import SNAPSHOT_JSON, FakeKeys, FakeLifecycle
from tests.support.serving import serve


@pytest.fixture
def api(lifecycle: FakeLifecycle, keys: FakeKeys) -> Iterator[str]:
    settings = ApiSettings()
    app = create_app(settings, wiring=Wiring(settings=settings, lifecycle=lifecycle, keys=keys))
    with serve(app) as url:
        yield url


def opts(api: str, key: str = ALICE) -> dict[str, object]:
    # sandbox_url must point at loopback too; nothing listens there, and nothing is dialled.
    return {"api_key": key, "api_url": api, "sandbox_url": "http://127.0.0.1:9"}


def test_sdk_control_plane_calls(api: str, lifecycle: FakeLifecycle) -> None:
    sbx = Sandbox.create(
        template="sandbox-base",
        timeout=300,
        lifecycle={"on_timeout": "pause", "auto_resume": True},
        **opts(api),
    )
    record = lifecycle.records[sbx.sandbox_id]
    assert record.auto_pause
    assert record.auto_resume
    assert record.owner == "alice"
    info = sbx.get_info()
    assert info.state.value == "running"
    assert info.metadata.get("snapshot") is None
    assert info.lifecycle == {"on_timeout": "pause", "auto_resume": True}

    assert sbx.pause() is True
    info = sbx.get_info()
    assert info.state.value == "paused"
    assert json.loads(base64.b64decode(info.metadata["snapshot"])) == SNAPSHOT_JSON
    assert Sandbox.pause(sbx.sandbox_id, **opts(api)) is False  # 409: already paused

    again = Sandbox.connect(sbx.sandbox_id, **opts(api))
    assert again.sandbox_id == sbx.sandbox_id
    assert lifecycle.records[sbx.sandbox_id].state == "running"

    again.set_timeout(120)
    assert lifecycle.records[sbx.sandbox_id].timeout == 120
    listed = Sandbox.list(**opts(api)).next_items()
    assert [s.sandbox_id for s in listed] == [sbx.sandbox_id]
    assert Sandbox.list(**opts(api, BOB)).next_items() == []

    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sbx.sandbox_id, **opts(api, BOB))
    assert Sandbox.kill(sbx.sandbox_id, **opts(api, BOB)) is False  # 404 for another user
    assert again.kill() is True
    assert Sandbox.kill(sbx.sandbox_id, **opts(api)) is False  # gone: 404
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sbx.sandbox_id, **opts(api))


def test_sdk_wrong_key(api: str) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create(**opts(api, "not-a-key"))
