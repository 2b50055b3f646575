"""Warm pools through the whole system: the unmodified ``e2b`` SDK against a real stack of this
module's own (nats-server, the five services with ``TORPOR_POOLS``, bubblewrap pods, the
packaged ``sandbox-base`` template). A create takes a warm pod, a resume takes another one and
replays the sandbox's processes in it; the events say so."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from e2b import Sandbox

from tests.support.fixtures import started
from tests.support.pods import release_pods, warm_pods
from tests.support.stack import Stack
from tests.support.waiting import until

pytestmark = pytest.mark.slow
SIZE = 1


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    system = Stack(tmp_path_factory.mktemp("pools"), env={"TORPOR_POOLS": f"sandbox-base={SIZE}"})
    yield from started(system)
    # The stack kills its pods; the pool's waiting pod (no test kills it) leaves its mounts.
    asyncio.run(release_pods(system.data_dir))


@pytest.fixture(scope="module")
def opts(stack: Stack) -> dict[str, Any]:
    return stack.sdk_opts("alice")


def pool_full(stack: Stack) -> None:
    until(lambda: asyncio.run(warm_pods(stack.nats_url)) >= SIZE, 120, "a full pool", every=0.2)


def test_sdk_create_and_resume_take_warm_pods(stack: Stack, opts: dict[str, Any]) -> None:
    pool_full(stack)
    s = Sandbox.create(template="base", timeout=120, envs={"GREETING": "hi"}, **opts)
    try:
        created = asyncio.run(stack.last_event("created", s.sandbox_id))
        assert created["path"] == "warm"
        # The sandbox's own identity, env, user, files and volume: bound at claim.
        assert s.commands.run("whoami").stdout.strip() == "user"
        out = s.commands.run("echo $E2B_SANDBOX_ID $GREETING $(hostname)").stdout.split()
        assert out == [s.sandbox_id, "hi", s.sandbox_id]
        s.files.write("/home/user/notes.txt", "kept")
        assert s.commands.run("stat -c %U /home/user/notes.txt").stdout.strip() == "user"
        s.files.write("/mnt/shared/v.txt", "shared")
        # Root inside cannot undo what the runtime mounted at claim.
        umount = s.commands.run("umount /mnt/shared 2>&1; echo rc=$?", user="root")
        assert "rc=0" not in umount.stdout
        handle = s.commands.run("sleep 600", background=True, timeout=0)
        old_pid = handle.pid
        s.pause()

        pool_full(stack)
        resumed = Sandbox.connect(s.sandbox_id, **opts)
        event = asyncio.run(stack.last_event("resumed", s.sandbox_id))
        assert event["path"] == "warm"
        with stack.client("alice") as api:
            report = api.get(f"/api/v1/sandbox/{s.sandbox_id}").json()["lastResume"]
        assert report["path"] == "warm"
        (proc,) = report["processes"]
        assert proc["oldPid"] == old_pid and proc["error"] is None
        assert [p.pid for p in resumed.commands.list() if "sleep 600" in p.cmd + " ".join(p.args)]
        assert resumed.files.read("/home/user/notes.txt") == "kept"
        assert resumed.files.read("/mnt/shared/v.txt") == "shared"
        check = resumed.commands.run("whoami; stat -c %U /home/user/notes.txt; hostname")
        assert check.stdout.split() == ["user", "user", s.sandbox_id]
        # Nothing of the warm pod's own root is left reachable inside.
        listing = resumed.commands.run("ls -a /", user="root").stdout.split()
        assert ".torpor-next-root" not in listing
    finally:
        Sandbox.kill(s.sandbox_id, **opts)


def test_sdk_create_falls_back_to_a_cold_pod_when_the_pool_is_empty(
    stack: Stack, opts: dict[str, Any]
) -> None:
    pool_full(stack)
    sandboxes = [Sandbox.create(template="base", timeout=120, **opts) for _ in range(SIZE + 1)]
    try:
        paths = [asyncio.run(stack.last_event("created", s.sandbox_id))["path"] for s in sandboxes]
        assert "cold" in paths and paths.count("warm") <= SIZE
        for s in sandboxes:
            assert s.commands.run("echo $E2B_SANDBOX_ID").stdout.strip() == s.sandbox_id
    finally:
        for s in sandboxes:
            Sandbox.kill(s.sandbox_id, **opts)
