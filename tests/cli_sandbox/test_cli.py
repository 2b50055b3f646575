"""``torpor sandbox ...`` as a real subprocess against a real ``torpor up``: every command, the
ways to point it at an API, and one readable line + exit 1 for a wrong key or unknown sandbox."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import uuid
from typing import Any

import pytest

from shared.bus.server import free_port
from tests.support.env import REPO, TORPOR, cli_env
from tests.support.stack import Stack

pytestmark = pytest.mark.slow


def run(
    *args: str, env: dict[str, str], real: bool = False, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``torpor sandbox ARGS``: in this process through ``services.cli.main.main`` (the same code
    path, minus ~3 s of interpreter start-up per call), or as a real subprocess."""
    if not real:
        return _in_process(list(args), env)
    return subprocess.run(
        [*TORPOR, "sandbox", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
        check=False,
    )


def _in_process(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    from services.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["sandbox", *args])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def as_user(up: Stack, user: str, **extra: str) -> dict[str, str]:
    return cli_env(E2B_API_URL=up.api_url, E2B_API_KEY=up.keys[user], **extra)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return result.stdout


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("torpor: error: ")
    return lines[0]


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_full_lifecycle_through_the_cli(up: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    env = as_user(up, "alice")
    name = _name("cli")

    created = ok(
        run("create", "--name", name, "--timeout", "600", "-m", "team=blue", env=env, real=True)
    )
    assert created.strip() == name

    # A process to be snapshotted, started with the unmodified e2b SDK through the proxy.
    from e2b import Sandbox

    for key, value in up.sdk_env("alice").items():
        monkeypatch.setenv(key, value)
    # Names are per user; the E2B side (SDK, proxy) takes the sandbox id behind the name.
    sandbox_id = json.loads(ok(run("get", name, "--json", env=env)))["sandboxId"]
    sleeper = Sandbox.connect(sandbox_id).commands.run("sleep 1000", background=True, cwd="/tmp")

    listed = ok(run("list", env=env))
    row = next(line for line in listed.splitlines() if line.startswith(name))
    assert "alice" in row
    assert "running" in row
    assert "NAME" in listed.splitlines()[0]

    items: list[dict[str, Any]] = json.loads(ok(run("list", "--json", env=env)))
    mine = next(i for i in items if i["name"] == name)
    assert mine["metadata"] == {"team": "blue"}
    assert mine["timeout"] == 600

    got = ok(run("get", name, env=env))
    assert "metadata.team" in got
    assert "blue" in got
    assert json.loads(ok(run("get", name, "--json", env=env)))["state"] == "running"

    paused = ok(run("pause", name, env=env))
    assert f"{name} is paused" in paused
    assert "sleep 1000" in paused  # the decoded snapshot, as a table
    assert str(sleeper.pid) in paused
    shown = ok(run("get", name, env=env))
    assert "snapshot captured" in shown
    assert "sleep 1000" in shown

    resumed = ok(run("resume", name, env=env))
    assert f"{name} is running" in resumed
    assert "deadline in " in resumed

    logs = ok(run("logs", name, env=env))
    facts = [line.split()[3] for line in logs.splitlines()[1:] if line.strip()[:1].isdigit()]
    assert facts[0] == "created"
    assert facts.index("snapshotted") < facts.index("paused") < facts.index("resumed")
    as_json = json.loads(ok(run("logs", name, "--json", env=env)))
    assert next(e["fact"] for e in as_json if e["fact"] != "activity") == "created"

    killed = ok(run("kill", name, env=env))
    assert f"{name} killed" in killed
    assert "not found" in one_error_line(run("get", name, env=env))
    after = [e["fact"] for e in json.loads(ok(run("logs", name, "--json", env=env)))]
    assert after[-1] == "killed"


def test_pausing_twice_is_one_line_and_exit_1(up: Stack) -> None:
    env = as_user(up, "bob")
    name = _name("twice")
    ok(run("create", "--name", name, env=env))
    try:
        ok(run("pause", name, env=env))
        line = one_error_line(run("pause", name, env=env))
        assert name in line
        ok(run("resume", name, env=env))
        assert "already running" in one_error_line(run("resume", name, env=env))
    finally:
        run("kill", name, env=env)


def test_wrong_key_is_one_readable_line_and_exit_1(up: Stack) -> None:
    secret = "torpor_" + "0" * 48
    env = cli_env(E2B_API_URL=up.api_url, E2B_API_KEY=secret)
    for args in (("list",), ("get", "whatever"), ("create",), ("logs", "whatever")):
        result = run(*args, env=env, real=args == ("list",))
        line = one_error_line(result)
        assert "invalid API key" in line
        assert secret not in result.stderr + result.stdout
    # The flag wins over the environment.
    assert ok(run("list", "--api-key", up.keys["bob"], env=env)) is not None


def test_unknown_sandbox_is_one_readable_line_and_exit_1(up: Stack) -> None:
    env = as_user(up, "alice")
    for command in ("get", "pause", "resume", "kill", "logs"):
        line = one_error_line(run(command, "no-such-sandbox", env=env, real=command == "get"))
        assert line == "torpor: error: sandbox no-such-sandbox not found", line
    # Someone else's sandbox does not exist either.
    name = _name("private")
    ok(run("create", "--name", name, env=as_user(up, "bob")))
    try:
        assert "not found" in one_error_line(run("get", name, env=env))
        assert "not found" in one_error_line(run("logs", name, env=env))
        admin = ok(run("list", "--owner", "bob", env=as_user(up, "root")))
        assert name in admin
    finally:
        run("kill", name, env=as_user(up, "bob"))
    assert "not a sandbox name" in one_error_line(run("get", "Bad_Name", env=env))


def test_falls_back_to_the_running_instance_like_torpor_env(up: Stack) -> None:
    local = cli_env(TORPOR_DATA_DIR=str(up.data_dir))
    assert ok(run("list", "--json", env=local)).strip().startswith("[")
    assert ok(run("list", "--json", "--data-dir", str(up.data_dir), env=cli_env()))

    # TORPOR_API_* wins over E2B_API_*.
    both = cli_env(
        TORPOR_API_URL=up.api_url,
        TORPOR_API_KEY=up.keys["bob"],
        E2B_API_URL="http://127.0.0.1:1",
        E2B_API_KEY="torpor_wrong",
    )
    ok(run("list", env=both))

    # The local admin key is never sent to another URL: with no key for it, a config error.
    elsewhere = run(
        "list",
        "--url",
        f"http://127.0.0.1:{free_port()}",
        "--data-dir",
        str(up.data_dir),
        env=cli_env(),
    )
    assert elsewhere.returncode == 2
    assert "no API key" in elsewhere.stderr

    unreachable = run(
        "list", "--url", f"http://127.0.0.1:{free_port()}", "--api-key", "x", env=cli_env()
    )
    assert "cannot reach the torpor API" in one_error_line(unreachable)


def test_nothing_to_talk_to_is_a_config_error(tmp_path: Any) -> None:
    result = run("list", "--data-dir", str(tmp_path), env=cli_env(), real=True)
    assert result.returncode == 2
    assert "start 'torpor up'" in result.stderr
    assert "Traceback" not in result.stderr
