"""Bad configuration fails fast: exit code 2 and exactly one readable line, no traceback."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest

from shared.bus.server import free_port
from tests.support.env import clean_env, torpor


def _assert_one_line(result: object, *, contains: str) -> None:
    rc, err = result.returncode, result.stderr  # type: ignore[attr-defined]
    assert rc == 2, (rc, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("torpor: error:")
    assert contains in lines[0], lines[0]


def test_invalid_nats_url() -> None:
    result = torpor("keys", "list", env=clean_env(NATS_URL="localhost:4222"))
    _assert_one_line(result, contains="NATS_URL")


def test_api_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = torpor(
            "up",
            "--data-dir",
            str(tmp_path / "d"),
            "--api-port",
            str(port),
            "--proxy-port",
            str(free_port()),
            "--nats-port",
            "0",
        )
    _assert_one_line(result, contains=f"{port} is already in use")


def test_unwritable_data_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = torpor("up", "--data-dir", str(blocker / "data"), "--nats-port", "0")
    _assert_one_line(result, contains="not writable")


def test_bwrap_missing(tmp_path: Path) -> None:
    # The interpreter is called by absolute path, so an empty PATH only hides bwrap.
    env = clean_env(PATH=str(tmp_path / "empty-bin"))
    result = torpor(
        "up",
        "--data-dir",
        str(tmp_path / "d"),
        "--api-port",
        str(free_port()),
        "--proxy-port",
        str(free_port()),
        "--nats-port",
        "0",
        env=env,
    )
    _assert_one_line(result, contains="apt-get install -y bubblewrap")


def test_bad_port_setting(tmp_path: Path) -> None:
    result = torpor("up", "--data-dir", str(tmp_path / "d"), env=clean_env(TORPOR_API_PORT="abc"))
    _assert_one_line(result, contains="api_port")


def test_env_without_instance(tmp_path: Path) -> None:
    result = torpor("env", "--data-dir", str(tmp_path))
    _assert_one_line(result, contains="no running torpor instance")


def test_unknown_service() -> None:
    result = torpor("run", "no-such-service")
    _assert_one_line(result, contains="unknown service")


@pytest.mark.skipif(sys.platform != "linux", reason="uses /proc")
def test_stale_state_file_is_ignored(tmp_path: Path) -> None:
    stale = {
        "pid": 999999999,
        "data_dir": str(tmp_path),
        "nats_url": "nats://127.0.0.1:1",
        "api_url": "http://127.0.0.1:1",
        "sandbox_url": "http://127.0.0.1:2",
        "api_port": 1,
        "proxy_port": 2,
        "started_at": "2026-01-01T00:00:00Z",
    }
    (tmp_path / "torpor.json").write_text(json.dumps(stale))
    result = torpor("env", "--data-dir", str(tmp_path))
    _assert_one_line(result, contains="no running torpor instance")
    assert os.path.exists(tmp_path / "torpor.json")
