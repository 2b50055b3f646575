"""Hostile state inside a sandbox before a memory pause (the unmodified SDK's
``pause(mode="full")``): CRIU's restore runs as host root over images the sandbox shaped, so
nothing it recreates may land outside the pod. A deleted-but-open file is a "ghost" CRIU
recreates by path on restore; its folder swapped for a symlink to a host folder would steer
that path out of the pod (the restore tried it, and failed only by chance), so such a tree
keeps no memory. An open file's folder swapped the same way is harmless: its dumped path is the
real one."""

from __future__ import annotations

import os
import shlex
import uuid
from pathlib import Path
from typing import Any

import pytest
from e2b import Sandbox

from tests.conftest import skip_or_fail
from tests.security.pod_support import run
from tests.support.stack import Stack
from tests.support.waiting import until

pytestmark = pytest.mark.slow

# Opens <dir>/evil, writes, unlinks it (a ghost while it stays open), then swaps <dir> for a
# symlink to the host folder given, and sleeps holding the descriptor.
_GHOST = """
import os, sys, time
folder, target = sys.argv[1], sys.argv[2]
os.makedirs(folder, exist_ok=True)
f = open(os.path.join(folder, "evil"), "w")
f.write("written by the sandbox")
f.flush()
os.unlink(os.path.join(folder, "evil"))
os.rmdir(folder)
os.symlink(target, folder)
open("/tmp/ghost-ready", "w").close()
time.sleep(100000)
"""


def _memory_pause_and_connect(stack: Stack, s: Sandbox) -> tuple[Sandbox, dict[str, Any]]:
    """``pause(mode="full")``, connect again; the sandbox and its resume report."""
    s.pause(mode="full")
    resumed = Sandbox.connect(s.sandbox_id, **stack.sdk_opts("alice"))
    with stack.client("alice") as api:
        report: dict[str, Any] = api.get(f"/api/v1/sandbox/{s.sandbox_id}").json()["lastResume"]
    if "CRIU is not usable" in (report["memoryNote"] or ""):
        skip_or_fail(report["memoryNote"])
    return resumed, report


@pytest.mark.parametrize("folder", ["/home/user/g", "/tmp/g"])
def test_a_ghost_file_behind_a_symlink_lands_nowhere_on_the_host(stack: Stack, folder: str) -> None:
    opts: dict[str, Any] = stack.sdk_opts("alice")
    canary = Path("/var/tmp") / f"torpor-canary-{uuid.uuid4().hex[:12]}"
    canary.mkdir(mode=0o777)
    try:
        s = Sandbox.create(template="base", timeout=180, **opts)
        try:
            s.files.write("/tmp/ghost.py", _GHOST)
            run(
                s,
                f"nohup python3 /tmp/ghost.py {shlex.quote(folder)} {canary} >/dev/null 2>&1 &",
                user="root",
                timeout=10,
            )
            until(lambda: s.files.exists("/tmp/ghost-ready"), 30, what="the ghost planted")
            resumed, report = _memory_pause_and_connect(stack, s)
            # Refused at the dump: files only, with the reason; the restore never ran.
            assert report["memoryKept"] is False, report
            assert "deleted file(s) open" in report["memoryNote"], report["memoryNote"]
            assert resumed.commands.run("echo alive").stdout.strip() == "alive"
        finally:
            Sandbox.kill(s.sandbox_id, **opts)
        assert os.listdir(canary) == [], os.listdir(canary)
    finally:
        for entry in canary.iterdir():
            entry.unlink()
        canary.rmdir()


# Opens <dir>/secret (a file of the sandbox's own, of the size given), swaps <dir> for a symlink
# to the host folder, and on SIGUSR1 writes what its descriptor reads to /tmp/read-back.
_REOPEN = """
import os, signal, sys, time
folder, target, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(folder, exist_ok=True)
with open(os.path.join(folder, "secret"), "w") as w:
    w.write("s" * size)
f = open(os.path.join(folder, "secret"))
os.rename(folder, folder + ".moved")
os.symlink(target, folder)
def tell(*_):
    f.seek(0)
    with open("/tmp/read-back.tmp", "w") as out:
        out.write(f.read())
    os.replace("/tmp/read-back.tmp", "/tmp/read-back")
signal.signal(signal.SIGUSR1, tell)
open("/tmp/reopen-ready", "w").write(str(os.getpid()))
while True:
    signal.pause()
"""


def test_an_open_file_behind_a_swapped_folder_is_not_reopened_on_the_host(
    stack: Stack,
) -> None:
    """CRIU reopens a restored process's files by their dumped path: a folder on that path
    swapped for a symlink to a host folder (holding a file of the same name and size) must
    not hand the host file to the sandbox."""
    opts: dict[str, Any] = stack.sdk_opts("alice")
    canary = Path("/var/tmp") / f"torpor-canary-{uuid.uuid4().hex[:12]}"
    canary.mkdir(mode=0o755)
    token = uuid.uuid4().hex
    (canary / "secret").write_text(token)
    (canary / "secret").chmod(0o644)
    try:
        s = Sandbox.create(template="base", timeout=180, **opts)
        try:
            s.files.write("/tmp/reopen.py", _REOPEN)
            args = f"/home/user/g {canary} {len(token)}"
            run(
                s, f"nohup python3 /tmp/reopen.py {args} >/dev/null 2>&1 &", user="root", timeout=10
            )
            until(lambda: s.files.exists("/tmp/reopen-ready"), 30, what="the file opened")
            pid = s.files.read("/tmp/reopen-ready").strip()
            resumed, report = _memory_pause_and_connect(stack, s)
            assert report["memoryKept"] is True, report["memoryNote"]
            # The restored descriptor is the sandbox's own file (the dump named it by its
            # real path, g.moved/secret), not the host file behind the symlink.
            resumed.commands.run(f"kill -USR1 {pid}", user="root")
            until(lambda: resumed.files.exists("/tmp/read-back"), 30, what="the read-back")
            assert resumed.files.read("/tmp/read-back") == "s" * len(token)
        finally:
            Sandbox.kill(s.sandbox_id, **opts)
    finally:
        for entry in canary.iterdir():
            entry.unlink()
        canary.rmdir()
