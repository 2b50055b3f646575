"""E2B's sandbox environment through the unmodified SDK against a real stack on the local runtime:
the Debian rootfs (python, pip, node, git, curl), user ``user`` with ``/home/user`` as home and
cwd, ``user="root"`` on request, passwordless ``sudo``, relative paths and file owners as E2B's
envd has them, and files kept across a pause (manual, on timeout, auto-resume) unless the
template says ``persist: none``."""

from __future__ import annotations

from typing import Any

import pytest
from e2b import CommandExitException, Sandbox

from tests.support.stack import Stack
from tests.support.waiting import until

pytestmark = pytest.mark.slow


def _out(s: Sandbox, cmd: str, **kwargs: Any) -> str:
    return str(s.commands.run(cmd, **kwargs).stdout).strip()


# ---------------------------------------------------------------- user, home, cwd


def test_default_user_home_and_cwd(sbx: Sandbox) -> None:
    assert _out(sbx, "whoami") == "user"
    assert _out(sbx, "id -u; id -g") == "1000\n1000"
    assert _out(sbx, "pwd") == "/home/user"
    assert _out(sbx, 'echo "$HOME $USER $LOGNAME"') == "/home/user user user"
    assert _out(sbx, "pwd", cwd="/tmp") == "/tmp"


def test_root_on_request(sbx: Sandbox) -> None:
    assert _out(sbx, "whoami", user="root") == "root"
    assert _out(sbx, 'echo "$HOME"; pwd', user="root") == "/root\n/root"
    # What root creates is root's; what user creates is user's.
    sbx.commands.run("touch /tmp/by-root", user="root")
    sbx.commands.run("touch /tmp/by-user")
    assert _out(sbx, "stat -c %U /tmp/by-root /tmp/by-user") == "root\nuser"


def test_passwordless_sudo(sbx: Sandbox) -> None:
    assert _out(sbx, "sudo whoami") == "root"
    assert _out(sbx, "sudo -u user whoami") == "user"
    assert _out(sbx, "sudo sh -c 'echo $HOME; id -u'") == "/root\n0"
    assert _out(sbx, "echo piped | sudo tee /etc/torpor-sudo-test") == "piped"
    assert _out(sbx, "cat /etc/torpor-sudo-test; stat -c %U /etc/torpor-sudo-test") == "piped\nroot"
    with pytest.raises(CommandExitException) as exc:
        sbx.commands.run("sudo sh -c 'exit 7'")
    assert exc.value.exit_code == 7
    # Without sudo, user cannot write system folders.
    with pytest.raises(CommandExitException):
        sbx.commands.run("touch /usr/local/bin/nope")
    # Root can install system-wide (dpkg's own database is writable by root).
    assert _out(sbx, "sudo touch /usr/local/lib/x && sudo rm /usr/local/lib/x && echo ok") == "ok"


def test_relative_paths_resolve_against_the_users_home(sbx: Sandbox) -> None:
    info = sbx.files.write("relative.txt", "hello")
    assert info.path == "/home/user/relative.txt"
    assert sbx.files.read("/home/user/relative.txt") == "hello"
    assert _out(sbx, "cat relative.txt") == "hello"
    root_info = sbx.files.write("root-relative.txt", "r", user="root")
    assert root_info.path == "/root/root-relative.txt"
    assert sbx.files.read("root-relative.txt", user="root") == "r"
    assert sbx.files.exists("~/relative.txt")


def test_created_files_belong_to_the_user(sbx: Sandbox) -> None:
    sbx.files.write("deep/er/owned.txt", "x")
    info = sbx.files.get_info("deep/er/owned.txt")
    assert (info.owner, info.group, info.permissions) == ("user", "user", "-rw-r--r--")
    assert sbx.files.get_info("deep").owner == "user"
    sbx.files.make_dir("made/here")
    made = sbx.files.get_info("made/here")
    assert (made.owner, made.permissions) == ("user", "drwxr-xr-x")
    sbx.files.write("/tmp/root-owned.txt", "x", user="root")
    assert sbx.files.get_info("/tmp/root-owned.txt").owner == "root"


def test_e2b_base_tools_are_there(sbx: Sandbox) -> None:
    assert _out(sbx, "python --version").startswith("Python 3.")
    assert _out(sbx, "python3 -c 'import ssl, sqlite3; print(1)'") == "1"
    assert "pip" in _out(sbx, "pip --version")
    assert _out(sbx, "node -e 'console.log(6*7)'") == "42"
    assert _out(sbx, "git --version").startswith("git version")
    assert _out(sbx, "curl --version").startswith("curl ")
    assert _out(sbx, "test -e /etc/ssl/certs/ca-certificates.crt && echo ok") == "ok"
    # The sandbox's python, not torpor's interpreter.
    assert _out(sbx, "command -v python3") == "/usr/bin/python3"


# ---------------------------------------------------------------- files kept across a pause


def _write_marks(s: Sandbox, mark: str) -> None:
    s.files.write("kept.txt", mark)
    s.commands.run(f"echo {mark} > /tmp/kept-tmp.txt && echo {mark} | sudo tee /opt/kept-root.txt")
    s.commands.run("rm -f /home/user/.bashrc")  # a deletion is kept too


def _check_marks(s: Sandbox, mark: str) -> None:
    assert s.files.read("kept.txt") == mark
    assert _out(s, "cat /tmp/kept-tmp.txt /opt/kept-root.txt") == f"{mark}\n{mark}"
    assert _out(s, "stat -c %U kept.txt /opt/kept-root.txt") == "user\nroot"
    assert _out(s, "test -e /home/user/.bashrc || echo gone") == "gone"


def test_files_are_kept_across_a_manual_pause(opts: dict[str, object]) -> None:
    s = Sandbox.create(template="base", timeout=300, **opts)  # type: ignore[arg-type]
    try:
        _write_marks(s, "manual")
        s.pause()
        assert Sandbox.get_info(s.sandbox_id, **opts).state == "paused"  # type: ignore[arg-type]
        resumed = Sandbox.connect(s.sandbox_id, **opts)  # type: ignore[arg-type]
        _check_marks(resumed, "manual")
    finally:
        Sandbox.kill(s.sandbox_id, **opts)  # type: ignore[arg-type]


def _paused_by_its_timeout(opts: dict[str, object], mark: str, *, auto_resume: bool) -> Sandbox:
    """A sandbox with marks written, once its 5 s timeout has paused it."""
    s = Sandbox.create(
        template="base",
        timeout=5,
        lifecycle={"on_timeout": "pause", "auto_resume": auto_resume},
        **opts,  # type: ignore[arg-type]
    )
    try:
        _write_marks(s, mark)
        until(
            lambda: Sandbox.get_info(s.sandbox_id, **opts).state == "paused",  # type: ignore[arg-type]
            90,
            "the timeout pause",
        )
    except BaseException:
        Sandbox.kill(s.sandbox_id, **opts)  # type: ignore[arg-type]
        raise
    return s


def test_files_are_kept_across_a_timeout_pause(opts: dict[str, object]) -> None:
    s = _paused_by_its_timeout(opts, "on-timeout", auto_resume=False)
    try:
        resumed = Sandbox.connect(s.sandbox_id, **opts)  # type: ignore[arg-type]
        _check_marks(resumed, "on-timeout")
    finally:
        Sandbox.kill(s.sandbox_id, **opts)  # type: ignore[arg-type]


def test_files_are_kept_across_an_auto_resume(opts: dict[str, object]) -> None:
    s = _paused_by_its_timeout(opts, "auto-resume", auto_resume=True)
    try:
        # Traffic through the proxy wakes it; the same handle keeps working.
        assert s.files.read("kept.txt") == "auto-resume"
        s.set_timeout(120)
        _check_marks(s, "auto-resume")
    finally:
        Sandbox.kill(s.sandbox_id, **opts)  # type: ignore[arg-type]


def test_persist_none_gives_a_fresh_disk(stack: Stack, opts: dict[str, object]) -> None:
    (stack.root / "templates" / "fresh-disk.yaml").write_text(
        "persist: none\nworkdir: /home/user\nenv:\n  LANG: C.UTF-8\n"
    )
    s = Sandbox.create(template="fresh-disk", timeout=300, **opts)  # type: ignore[arg-type]
    try:
        s.files.write("scratch.txt", "gone after a pause")
        s.pause()
        resumed = Sandbox.connect(s.sandbox_id, **opts)  # type: ignore[arg-type]
        assert not resumed.files.exists("scratch.txt")
        assert _out(resumed, "whoami") == "user"  # a fresh disk is still the full rootfs
    finally:
        Sandbox.kill(s.sandbox_id, **opts)  # type: ignore[arg-type]


def test_log_from_before_the_pause_is_kept_with_the_replays_lines(
    opts: dict[str, object],
) -> None:
    """The seed's scenario without a volume: a background service appending to its log in the
    home folder; after pause and connect the log holds the line from before the pause and the
    replayed process's new one. (The seed's own command truncates its log with ``>``, so there
    the replay starts the file afresh by design of the command.)"""
    s = Sandbox.create(template="base", timeout=300, **opts)  # type: ignore[arg-type]
    try:
        s.files.write(
            "server.py",
            "import time, uuid\nprint('boot', uuid.uuid4().hex, flush=True)\ntime.sleep(1e9)\n",
        )
        s.commands.run("python3 server.py >> service.log 2>&1", background=True, timeout=0)
        first = until(lambda: _out(s, "cat service.log"), 30, "the first log line")
        s.pause()
        resumed = Sandbox.connect(s.sandbox_id, **opts)  # type: ignore[arg-type]

        def two_lines() -> list[str]:
            lines = [ln for ln in _out(resumed, "tail service.log").splitlines() if ln]
            return lines if len(lines) >= 2 else []

        lines = until(two_lines, 30, "the replayed process's line")
        assert lines[0] == first
        assert lines[1].startswith("boot ") and lines[1] != first
    finally:
        Sandbox.kill(s.sandbox_id, **opts)  # type: ignore[arg-type]
