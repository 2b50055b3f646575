"""Bus credential settings: hostile and incomplete values are one readable line and exit 2, and
no password is ever echoed (fast tier; no server needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from shared.bus.broker import connect_options, redact_url
from shared.bus.credentials import load_or_create, read, server_env
from shared.errors import ConfigError
from shared.settings import BusSettings, load
from tests.support.env import REPO, TORPOR, cli_env


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"NATS_USER": "api"}, "NATS_USER and NATS_PASSWORD go together"),
        ({"NATS_PASSWORD": "pw-only"}, "NATS_USER and NATS_PASSWORD go together"),
        ({"NATS_USER": "api", "NATS_PASSWORD": "x", "NATS_CREDS": "/x.creds"}, "not both"),
        ({"NATS_USER": "a b", "NATS_PASSWORD": "x"}, "NATS_USER"),
        ({"NATS_USER": "a\x01b", "NATS_PASSWORD": "x"}, "NATS_USER"),
        ({"NATS_USER": "u" * 65, "NATS_PASSWORD": "x"}, "NATS_USER"),
    ],
)
def test_bad_credentials_are_one_config_error(
    env: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("NATS_USER", "NATS_PASSWORD", "NATS_CREDS", "NATS_URL"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError) as caught:
        load(BusSettings)
    assert expected in str(caught.value)
    assert "pw-only" not in str(caught.value)


def test_credentials_reach_every_connection_and_never_the_url_or_repr() -> None:
    bus = BusSettings(nats_url="nats://127.0.0.1:4222", nats_user="api", nats_password="pSECRET")
    assert connect_options(bus) == {"user": "api", "password": "pSECRET"}
    assert "pSECRET" not in repr(bus)
    assert bus.authenticated
    assert not BusSettings(nats_url="nats://127.0.0.1:4222").authenticated
    assert BusSettings(nats_url="nats://u:p@127.0.0.1:4222").authenticated
    assert (
        redact_url("nats://api:pSECRET@h:4222,nats://h2:4222") == "nats://***@h:4222,nats://h2:4222"
    )


def test_cli_refuses_half_credentials_without_echoing_them() -> None:
    out = subprocess.run(
        [*TORPOR, "keys", "list", "--nats-url", "nats://127.0.0.1:1"],
        capture_output=True,
        text=True,
        env=cli_env(NATS_PASSWORD="pw-half-secret"),
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1, out.stderr
    assert "NATS_USER and NATS_PASSWORD go together" in out.stderr
    assert "pw-half-secret" not in out.stderr + out.stdout


def test_generated_passwords_are_stable_private_and_nats_safe(tmp_path: Path) -> None:
    folder = tmp_path / "nats"
    first = load_or_create(folder)
    assert load_or_create(folder) == first  # kept across restarts
    assert read(folder) == first
    assert (folder / "credentials.json").stat().st_mode & 0o777 == 0o600
    assert folder.stat().st_mode & 0o777 == 0o700
    for password in first.values():
        # nats-server would parse an all-digit (or number-like) environment value as a number.
        assert password[0].isalpha()
        assert len(password) >= 40
    assert set(server_env(first)) == {f"NATS_{u.upper()}_PASSWORD" for u in first}
    (folder / "credentials.json").write_text('{"api": 5}')
    with pytest.raises(ConfigError, match="malformed"):
        read(folder)
