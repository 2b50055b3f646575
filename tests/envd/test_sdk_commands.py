"""The unmodified e2b SDK driving the daemon: commands, background processes, PTY."""

from __future__ import annotations

import time

import pytest
from e2b import CommandExitException, PtySize, Sandbox

from tests.envd.conftest import Daemon


def _wait_for(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_foreground_stdout_and_stderr(sbx: Sandbox) -> None:
    result = sbx.commands.run("echo out; echo err >&2; printf 'ü'")
    assert result.exit_code == 0
    assert result.stdout == "out\nü"
    assert result.stderr == "err\n"


def test_nonzero_exit_raises(sbx: Sandbox) -> None:
    with pytest.raises(CommandExitException) as info:
        sbx.commands.run("echo partial; exit 3")
    assert info.value.exit_code == 3
    assert info.value.stdout == "partial\n"


def test_default_cwd_is_root_and_envs_apply(sbx: Sandbox, daemon: Daemon) -> None:
    result = sbx.commands.run('pwd; echo "$GREETING"', envs={"GREETING": "hi"})
    assert result.stdout.splitlines() == [str(daemon.root), "hi"]
    (daemon.root / "sub").mkdir(exist_ok=True)
    assert sbx.commands.run("pwd", cwd="sub").stdout.strip() == str(daemon.root / "sub")


def test_background_process_outlives_its_handle(sbx: Sandbox, daemon: Daemon) -> None:
    marker = daemon.root / "bg.txt"
    sbx.commands.run(
        "sleep 0.5; echo alive > bg.txt; sleep 30", background=True, timeout=0, cwd=str(daemon.root)
    )  # the handle is dropped at once; the stream closes
    assert _wait_for(marker.exists), "background process did not keep running"
    procs = [p for p in sbx.commands.list() if "echo alive" in " ".join(p.args)]
    assert len(procs) == 1
    assert procs[0].cmd == "/bin/bash"
    assert sbx.commands.kill(procs[0].pid) is True
    assert _wait_for(lambda: all(p.pid != procs[0].pid for p in sbx.commands.list()))
    assert sbx.commands.kill(procs[0].pid) is False  # NOT_FOUND -> False


def test_list_connect_and_stdin(sbx: Sandbox) -> None:
    handle = sbx.commands.run("read line; echo got:$line", background=True, stdin=True, timeout=0)
    assert handle.pid in [p.pid for p in sbx.commands.list()]
    connected = sbx.commands.connect(handle.pid)
    sbx.commands.send_stdin(handle.pid, "hello\n")
    result = connected.wait()
    assert result.stdout == "got:hello\n"
    assert result.exit_code == 0


def test_close_stdin_gives_eof(sbx: Sandbox) -> None:
    handle = sbx.commands.run("cat; echo done", background=True, stdin=True, timeout=0)
    sbx.commands.send_stdin(handle.pid, "abc")
    sbx.commands.close_stdin(handle.pid)
    result = handle.wait()
    assert result.stdout == "abcdone\n"


def test_timeout_kills_the_process(sbx: Sandbox, daemon: Daemon) -> None:
    from e2b import TimeoutException

    with pytest.raises(TimeoutException):  # deadline_exceeded, not an exit code
        sbx.commands.run("sleep 30; echo never > late.txt", timeout=1)
    assert _wait_for(
        lambda: not any("late.txt" in " ".join(p.args) for p in sbx.commands.list()), 5
    ), "Connect-Timeout-Ms did not end the process"
    assert not (daemon.root / "late.txt").exists()


def test_pty_session(sbx: Sandbox) -> None:
    chunks: list[bytes] = []
    handle = sbx.pty.create(PtySize(rows=24, cols=80), timeout=0)
    sbx.pty.send_stdin(handle.pid, b"stty size; echo $TERM; exit 7\n")
    with pytest.raises(CommandExitException) as info:
        handle.wait(on_pty=lambda data: chunks.append(bytes(data)))
    output = b"".join(chunks).decode(errors="replace")
    assert "24 80" in output
    assert "xterm-256color" in output
    assert info.value.exit_code == 7


def test_pty_resize(sbx: Sandbox) -> None:
    chunks: list[bytes] = []
    handle = sbx.pty.create(PtySize(rows=24, cols=80), timeout=0)
    sbx.pty.resize(handle.pid, PtySize(rows=40, cols=120))
    sbx.pty.send_stdin(handle.pid, b"stty size; exit\n")
    handle.wait(on_pty=lambda data: chunks.append(bytes(data)))
    assert "40 120" in b"".join(chunks).decode(errors="replace")
