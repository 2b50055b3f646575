"""Resume reports, lifecycle hooks and activity inside the sandbox, on one real stack of this
module's own (nats-server, the five services, bubblewrap pods; the unmodified ``e2b`` SDK).

- the resume report: each replayed process with its old and new pid, through the native API, the
  E2B connect body, and the unmodified SDK's ``Sandbox.connect`` (which must not mind the field);
- hooks: the template's and the sandbox's, in order (prePause, postResume after the replay,
  preKill before the delete), as ``user``; an aborting prePause keeps the sandbox running (409
  with the outcome); a timeout pause runs prePause too;
- activity inside: a process producing output keeps its sandbox from pausing while an idle one
  pauses, ``expiring`` comes before each automatic pause, and the template's ``maxLifetime``
  still pauses the busy one; the daemon's ``/keepalive`` is reachable from inside, its
  ``/activity`` is not (it needs the access token);
- a prePause that always aborts refuses timeout pauses only within the template's
  ``maxLifetime``: past it the pause proceeds, the outcome marked ``overridden``;
- a sandbox's hooks go with it to its forks and to sandboxes created from its snapshots.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from tests.support.fixtures import started
from tests.support.stack import SEED_TEMPLATE, Stack
from tests.support.waiting import until

pytestmark = pytest.mark.slow


# The seed's template (``/workspace`` on a host volume, so the test can read what hooks wrote
# after the sandbox is gone) with hooks of its own.
HOOKED_TEMPLATE = (
    SEED_TEMPLATE.replace("name: sandbox-base", "name: hooked")
    + """\
lifecycle:
  hooks:
    prePause: {command: 'echo "tpl-pre $(whoami)" >> /workspace/hooks.log', timeout: 10}
    postResume: {command: 'echo tpl-post >> /workspace/hooks.log'}
    preKill: {command: 'echo tpl-kill >> /workspace/hooks.log'}
"""
)


# Output and keep-alives count; a busy sandbox is still paused 25 s after it started.
BUSY_TEMPLATE = (
    SEED_TEMPLATE.replace("name: sandbox-base", "name: busy")
    + """\
lifecycle:
  activity: {signals: [output, keepalive], maxLifetime: 25, expiringNotice: 2}
"""
)


# The shortest maxLifetime: a timeout pause is refused by an aborting prePause only for 10 s.
BOUNDED_TEMPLATE = (
    SEED_TEMPLATE.replace("name: sandbox-base", "name: bounded")
    + """\
lifecycle:
  activity: {maxLifetime: 10}
"""
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from started(
        Stack(
            tmp_path_factory.mktemp("lifecycle-ext"),
            templates={
                "sandbox-base": SEED_TEMPLATE,
                "hooked": HOOKED_TEMPLATE,
                "busy": BUSY_TEMPLATE,
                "bounded": BOUNDED_TEMPLATE,
            },
        )
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
        assert report["memoryKept"] is False and "started again" in report["memoryNote"]
        assert report["templateVersion"].startswith("sha256:")
        assert report["replayed"] == 1 and report["failed"] == 0
        assert set(report["timings"]) == {
            "claimMs",
            "podMs",
            "filesMs",
            "replayMs",
            "hooksMs",
            "totalMs",
        }

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


def _workspace(stack: Stack, sandbox_id: str) -> Path:
    return stack.data_dir / "volumes" / "alice" / sandbox_id / "workspace"


def _create(stack: Stack, body: dict[str, Any]) -> str:
    with stack.client("alice") as c:
        created = c.post("/v2/sandboxes", json=body)
    assert created.status_code == 201, created.text
    return str(created.json()["sandboxID"])


def test_hooks_run_in_order_and_an_aborting_pre_pause_keeps_it_running(
    stack: Stack, opts: dict[str, Any], api: httpx.Client
) -> None:
    sid = _create(
        stack,
        {
            "templateID": "hooked",
            "timeout": 120,
            "hooks": {
                "prePause": {
                    "command": "echo my-pre >> /workspace/hooks.log; test ! -e /workspace/refuse",
                    "onFailure": "abort",
                },
                "postResume": {
                    "command": 'echo "my-post $(pgrep -x sleep)" >> /workspace/hooks.log'
                },
                "preKill": {"command": "echo my-kill >> /workspace/hooks.log"},
            },
        },
    )
    log = _workspace(stack, sid) / "hooks.log"
    try:
        s = Sandbox.connect(sid, **opts)
        s.commands.run("sleep 600", background=True, timeout=0)
        s.files.write("/workspace/refuse", "not now")

        refused = api.post(f"/sandboxes/{sid}/pause", json={})
        assert refused.status_code == 409, refused.text
        body = refused.json()
        assert "prePause hook failed (exit code 1" in body["message"]
        assert body["hook"]["exit_code"] == 1 and body["hook"]["aborted"] is True
        native = api.get(f"/api/v1/sandbox/{sid}").json()
        assert native["state"] == "running" and native["refusedPause"]["source"] == "sandbox"
        assert s.commands.run("echo still-here").stdout.strip() == "still-here"

        s.files.remove("/workspace/refuse")
        s.pause()
        resumed = Sandbox.connect(sid, **opts)
        (sleep_pid,) = _sleep_pids(resumed)
        lines = resumed.files.read("/workspace/hooks.log").splitlines()
        assert lines == [
            "tpl-pre user",
            "my-pre",  # refused
            "tpl-pre user",
            "my-pre",
            "tpl-post",
            f"my-post {sleep_pid}",  # after the replay: it sees the replayed process
        ]
        report = api.get(f"/api/v1/sandbox/{sid}").json()["lastResume"]
        assert [(h["source"], h["ok"]) for h in report["hooks"]] == [
            ("template", True),
            ("sandbox", True),
        ]
    finally:
        Sandbox.kill(sid, **opts)
    assert log.read_text().splitlines()[-2:] == ["tpl-kill", "my-kill"]


def test_a_timeout_pause_runs_pre_pause(
    stack: Stack, opts: dict[str, Any], api: httpx.Client
) -> None:
    sid = _create(
        stack,
        {
            "templateID": "base",
            "timeout": 3,
            "autoPause": True,
            "hooks": {"prePause": {"command": "date +%s > /workspace/pre-pause"}},
        },
    )
    try:
        # The native state: E2B's view says "paused" from the pause's start (``pausing``),
        # before prePause has run (CI: the file not there yet).
        until(lambda: _state(api, sid) == "paused", 90, "the timeout pause")
        assert (_workspace(stack, sid) / "pre-pause").read_text().strip().isdigit()
    finally:
        Sandbox.kill(sid, **opts)


def _events(api: httpx.Client, sandbox_id: str) -> list[str]:
    got = api.get(f"/events/sandboxes/{sandbox_id}", params={"orderAsc": "true", "limit": 100})
    assert got.status_code == 200, got.text
    return [e["type"].removeprefix("sandbox.lifecycle.") for e in got.json()]


def _state(api: httpx.Client, sandbox_id: str) -> str:
    return str(api.get(f"/api/v1/sandbox/{sandbox_id}").json()["state"])


def test_a_busy_process_keeps_it_running_an_idle_one_does_not(
    stack: Stack, opts: dict[str, Any], api: httpx.Client
) -> None:
    busy_id = _create(stack, {"templateID": "busy", "timeout": 4, "autoPause": True})
    idle_id = ""
    try:
        busy = Sandbox.connect(busy_id, **opts)
        busy.commands.run("while true; do echo tick; sleep 1; done", background=True, timeout=0)
        # From inside: the keep-alive is open to the sandbox's processes, the report is not.
        probe = busy.commands.run(
            "ip=$(hostname -I | cut -d' ' -f1); "
            "curl -s -o /dev/null -w '%{http_code} ' -X POST http://$ip:49983/keepalive; "
            "curl -s -o /dev/null -w '%{http_code} ' http://$ip:49983/activity; "
            "curl -s -o /dev/null -w '%{http_code}' -X POST http://$ip:49983/keepalive/../init"
        )
        assert probe.stdout.split() == ["204", "401", "401"]
        # Created after the busy one's last traffic: once it pauses, the busy one's own
        # timeout has long passed.
        idle_id = _create(stack, {"templateID": "busy", "timeout": 4, "autoPause": True})
        Sandbox.connect(idle_id, **opts).commands.run("sleep 600", background=True, timeout=0)

        until(lambda: _state(api, idle_id) == "paused", 90, "the idle sandbox's pause")
        assert _state(api, busy_id) == "running"  # kept up by its output alone
        idle_events = _events(api, idle_id)
        assert idle_events.index("expiring") < idle_events.index("paused")

        # Busy for ever, but the template's maxLifetime still pauses it.
        until(lambda: _state(api, busy_id) == "paused", 120, "the max lifetime's pause")
        busy_events = _events(api, busy_id)
        assert busy_events.index("expiring") < busy_events.index("paused")
    finally:
        for sid in (busy_id, idle_id):
            if sid:
                Sandbox.kill(sid, **opts)


def test_an_always_aborting_pre_pause_cannot_outlive_max_lifetime(
    stack: Stack, opts: dict[str, Any], api: httpx.Client
) -> None:
    sid = _create(
        stack,
        {
            "templateID": "bounded",
            "timeout": 3,
            "autoPause": True,
            "hooks": {"prePause": {"command": "exit 1", "onFailure": "abort"}},
        },
    )
    try:
        until(lambda: _state(api, sid) == "paused", 90, "the pause past maxLifetime")
        got = api.get(f"/events/sandboxes/{sid}", params={"orderAsc": "true", "limit": 100})
        assert got.status_code == 200, got.text
        outcomes = [e["eventData"]["outcome"] for e in got.json() if e["type"].endswith(".hook")]
        # Refused while within maxLifetime (3 s timeouts in 10 s), then overridden once.
        assert outcomes and all(not o["ok"] for o in outcomes)
        assert [o["overridden"] for o in outcomes] == [False] * (len(outcomes) - 1) + [True]
        assert all(o["aborted"] for o in outcomes[:-1]) and len(outcomes) >= 2
        assert not outcomes[-1]["aborted"]
    finally:
        Sandbox.kill(sid, **opts)


def _hooks_of(api: httpx.Client, sandbox_id: str) -> Any:
    got = api.get(f"/api/v1/sandbox/{sandbox_id}")
    assert got.status_code == 200, got.text
    return got.json()["hooks"]


def test_hooks_are_carried_to_forks_and_sandboxes_from_a_snapshot(
    stack: Stack, opts: dict[str, Any], api: httpx.Client
) -> None:
    mine = {"prePause": {"command": "echo mine", "timeout": 5, "onFailure": "abort"}}
    theirs = {"postResume": {"command": "echo theirs", "timeout": 5, "onFailure": "ignore"}}
    sid = _create(stack, {"templateID": "base", "timeout": 120, "hooks": mine})
    made: list[str] = []
    try:
        declared = _hooks_of(api, sid)
        assert declared["prePause"]["command"] == "echo mine"
        src = Sandbox.connect(sid, **opts)
        snap = src.create_snapshot().snapshot_id
        try:
            # From the snapshot: the source's hooks, unless the create declares its own.
            made.append(_create(stack, {"templateID": snap, "timeout": 120}))
            assert _hooks_of(api, made[-1]) == declared
            made.append(_create(stack, {"templateID": snap, "timeout": 120, "hooks": theirs}))
            own = _hooks_of(api, made[-1])
            assert own["postResume"]["command"] == "echo theirs" and own["prePause"] is None
        finally:
            Sandbox.delete_snapshot(snap, **opts)
        (fork,) = src.fork(count=1, timeout=120)
        assert isinstance(fork, Sandbox), fork
        made.append(fork.sandbox_id)
        assert _hooks_of(api, fork.sandbox_id) == declared
    finally:
        for each in (sid, *made):
            Sandbox.kill(each, **opts)
