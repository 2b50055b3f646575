"""Resource limits hold (cgroup v1 or v2): a fork bomb, a memory hog and a disk filler in one
sandbox stop at its template's limits while another sandbox and the API keep working, and the
attacking sandbox's pod is entirely gone once it is killed."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox

from tests.conftest import skip_or_fail
from tests.security.pod_support import (
    DISK_LIMIT,
    PIDS_LIMIT,
    SMALL,
    cgroups,
    create,
    install_templates,
    no_pod_left,
    pod_of,
    run,
)
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

FORK_BOMB = """
import os, time
n = 0
for _ in range(3000):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(120)
        os._exit(0)
    n += 1
print(n, flush=True)
"""
MEMORY_HOG = """
chunks = []
for _ in range(64):
    chunks.append(b"x" * (16 << 20))  # touched pages, 1 GiB in all
print("survived", flush=True)
"""


@pytest.fixture(scope="module")
def small(stack: Stack) -> Stack:
    if cgroups(stack) is None:
        skip_or_fail("no writable cgroup hierarchy (v1 or v2): pids and memory are not enforced")
    install_templates(stack)
    return stack


@pytest.fixture
def bystander(small: Stack) -> Iterator[Sandbox]:
    sbx = create(small)
    yield sbx
    sbx.kill()


def _others_fine(stack: Stack, bystander: Sandbox) -> None:
    assert run(bystander, "echo fine")[1].strip() == "fine"
    assert httpx.get(f"{stack.api_url}/health", timeout=10).status_code == 200


def _kill_and_check_gone(stack: Stack, sbx: Sandbox) -> None:
    pod = pod_of(stack, sbx.sandbox_id)
    assert sbx.kill() is True
    deadline = time.monotonic() + 30
    while left := no_pod_left(stack, pod.uid):
        assert time.monotonic() < deadline, f"the killed sandbox's pod is still there: {left}"
        time.sleep(0.2)


def test_fork_bomb_stops_at_the_pids_limit(small: Stack, bystander: Sandbox) -> None:
    sbx = create(small, template=SMALL)
    try:
        code, out = run(sbx, f"python3 -c '{FORK_BOMB}'", timeout=120)
        assert code == 0, out
        forked = int(out.split()[-1])
        assert 0 < forked < PIDS_LIMIT, f"{forked} processes under a limit of {PIDS_LIMIT}"
        groups = cgroups(small)
        assert groups is not None
        assert len(groups.procs(pod_of(small, sbx.sandbox_id).uid)) <= PIDS_LIMIT
        _others_fine(small, bystander)
    finally:
        _kill_and_check_gone(small, sbx)
    _others_fine(small, bystander)


def test_memory_hog_is_stopped_at_the_memory_limit(small: Stack, bystander: Sandbox) -> None:
    sbx = create(small, template=SMALL)
    try:
        code, out = run(sbx, f"python3 -c '{MEMORY_HOG}'", timeout=120)
        assert code != 0 and "survived" not in out, (code, out)
        _others_fine(small, bystander)
        # The hog died, not the sandbox: its daemon still answers.
        assert run(sbx, "echo after")[1].strip() == "after"
    finally:
        _kill_and_check_gone(small, sbx)


def test_disk_filler_is_stopped_at_the_disk_limit(small: Stack, bystander: Sandbox) -> None:
    sbx = create(small, template=SMALL)
    host_free = os.statvfs(small.data_dir).f_bavail * os.statvfs(small.data_dir).f_frsize
    try:
        _, out = run(sbx, "dd if=/dev/zero of=/workspace/fill bs=1M count=512 2>&1")
        assert "No space left on device" in out, out
        size = int(run(sbx, "stat -c %s /workspace/fill")[1])
        assert size <= DISK_LIMIT
        _, out = run(sbx, "dd if=/dev/zero of=/tmp/fill bs=1M count=512 2>&1")
        assert "No space left on device" in out, out
        after = os.statvfs(small.data_dir).f_bavail * os.statvfs(small.data_dir).f_frsize
        # Other writers share the disk: allow for them, but not for 512 MiB of ours.
        assert host_free - after < 256 * 2**20
        assert (
            run(sbx, "rm /workspace/fill /tmp/fill && echo x > /workspace/ok && cat /workspace/ok")[
                1
            ].strip()
            == "x"
        )
        _others_fine(small, bystander)
    finally:
        _kill_and_check_gone(small, sbx)
