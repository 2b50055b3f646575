"""Resume reports, lifecycle hooks and activity inside the sandbox, on one real stack of this
module's own (nats-server, the five services, bubblewrap pods; the unmodified ``e2b`` SDK).

- the resume report: each replayed process with its old and new pid, through the native API, the
  E2B connect body, and the unmodified SDK's ``Sandbox.connect`` (which must not mind the field).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from tests.support.fixtures import started
from tests.support.stack import SEED_TEMPLATE, Stack

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from started(
        Stack(tmp_path_factory.mktemp("lifecycle-ext"), templates={"sandbox-base": SEED_TEMPLATE})
    )


@pytest.fixture(scope="module")
def opts(stack: Stack) -> dict[str, Any]:
    return stack.sdk_opts("alice")


@pytest.fixture(scope="module")
def api(stack: Stack) -> Iterator[httpx.Client]:
    with stack.client("alice") as client:
        yield client


def _sleep_pids(s: Sandbox) -> list[int]:
    return [p.pid for p in s.commands.list() if "sleep 600" in " ".join([p.cmd, *p.args])]


def test_resume_report_lists_replayed_processes_with_new_pids(
    opts: dict[str, Any], api: httpx.Client
) -> None:
    s = Sandbox.create(template="base", timeout=120, **opts)
    try:
        handle = s.commands.run("sleep 600", background=True, timeout=0)
        old_pid = handle.pid
        s.pause()

        # The unmodified SDK's connect resumes it; the report in the body does not bother it.
        resumed = Sandbox.connect(s.sandbox_id, **opts)
        assert resumed.commands.run("echo alive").stdout.strip() == "alive"
        # Each pod has its own pid namespace: the new pid may well equal the old one.
        (new_pid,) = _sleep_pids(resumed)

        native = api.get(f"/api/v1/sandbox/{s.sandbox_id}").json()
        report = native["lastResume"]
        (proc,) = report["processes"]
        assert (proc["oldPid"], proc["newPid"], proc["error"]) == (old_pid, new_pid, None)
        assert report["filesKept"] is True and report["template"] == "sandbox-base"
        assert report["templateVersion"].startswith("sha256:")
        assert report["replayed"] == 1 and report["failed"] == 0
        assert set(report["timings"]) == {"claimMs", "podMs", "filesMs", "replayMs", "totalMs"}

        # The E2B connect body of a resume carries the same report (a running one: none).
        assert api.post(f"/api/v1/sandbox/pause/{s.sandbox_id}").status_code == 200
        body = api.post(f"/sandboxes/{s.sandbox_id}/connect", json={"timeout": 120})
        assert body.status_code == 201
        again = body.json()["resumeReport"]
        (proc2,) = again["processes"]
        assert proc2["oldPid"] == new_pid and [proc2["newPid"]] == _sleep_pids(resumed)
        running = api.post(f"/sandboxes/{s.sandbox_id}/connect", json={"timeout": 120})
        assert running.status_code == 200 and running.json()["resumeReport"] is None
    finally:
        Sandbox.kill(s.sandbox_id, **opts)
