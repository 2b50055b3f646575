"""Each pod start is a boot (local runtime): ``/proc/sys/kernel/random/boot_id`` is the pod's
own, new after a resume (torpor resumes cold: files kept, processes replayed, no memory image),
like a filesystem-only resume on E2B (its suite: ``test_pause_filesystem_only``,
``test_auto_pause_filesystem_only_reboots``). Before, every pod read the host's. Sandbox root
cannot change it."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from e2b import CommandExitException, Sandbox

from tests.support.stack import Stack

pytestmark = pytest.mark.slow

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _boot_id(s: Sandbox) -> str:
    value = s.files.read(BOOT_ID).strip()
    uuid.UUID(value)  # the kernel's format, so readers parsing it keep working
    return value


def test_a_pod_boots_with_its_own_id(stack: Stack, sbx: Sandbox) -> None:
    first = _boot_id(sbx)
    assert first != Path(BOOT_ID).read_text().strip()
    assert sbx.commands.run(f"cat {BOOT_ID}").stdout.strip() == first
    opts = stack.sdk_opts("alice")
    other = Sandbox.create(template="base", timeout=60, **opts)
    try:
        assert _boot_id(other) not in (first, Path(BOOT_ID).read_text().strip())
    finally:
        Sandbox.kill(other.sandbox_id, **opts)


def test_sandbox_root_cannot_change_it(sbx: Sandbox) -> None:
    before = _boot_id(sbx)
    for command in (
        f"echo 00000000-0000-0000-0000-000000000000 > {BOOT_ID}",
        f"mount -t tmpfs none {BOOT_ID}",
        f"umount {BOOT_ID}",
    ):
        with pytest.raises(CommandExitException):
            sbx.commands.run(command, user="root")
    assert _boot_id(sbx) == before


def test_a_resume_is_a_new_boot_with_the_files_kept(stack: Stack, sbx: Sandbox) -> None:
    before = _boot_id(sbx)
    sbx.files.write("/home/user/marker.txt", "kept")
    sbx.pause()
    resumed = Sandbox.connect(sbx.sandbox_id, **stack.sdk_opts("alice"))
    assert resumed.files.read("/home/user/marker.txt") == "kept"
    assert _boot_id(resumed) != before
