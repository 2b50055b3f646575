"""Lifecycle hooks in memory (the real lifecycle service, snapshotter and scaler routers; a fake
runtime and daemon): order around capture, replay and delete; abort and ignore; the outcomes in
the events and on the record; hostile declarations refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from services.api.schemas import NativeCreate, NewSandbox
from shared.domain.states import SandboxState
from shared.errors import PauseRefused, RuntimeFailure
from shared.lifecycle.hooks import PauseReason, abort_honoured, outcome_of, refusal
from shared.models.lifecycle import Hook, Hooks, TemplateFacts
from shared.models.messages import SandboxHookRan
from shared.ports.envd import CommandResult
from shared.ports.lifecycle import CreateRequest
from tests.fakes.system import InMemorySystem, in_memory_system

pytestmark = pytest.mark.unit

TEMPLATE_HOOKS = Hooks(
    pre_pause=Hook(command="tpl-pre-pause"),
    post_resume=Hook(command="tpl-post-resume"),
    pre_kill=Hook(command="tpl-pre-kill"),
)


def _facts(name: str) -> TemplateFacts:
    return TemplateFacts(name=name, version="sha256:x", hooks=TEMPLATE_HOOKS)


@pytest.fixture
async def system() -> AsyncIterator[InMemorySystem]:
    async with in_memory_system(templates=_facts) as s:
        yield s


def _hooks(**kw: Any) -> Hooks:
    return Hooks.model_validate(kw)


async def _create(system: InMemorySystem, sid: str, hooks: Hooks) -> None:
    secret = {"API_TOKEN": "sk-live-0123456789abcdef"}
    await system.lifecycle.create(
        CreateRequest(owner="alice", sandbox_id=sid, hooks=hooks, envs=secret)
    )


def _ran(system: InMemorySystem) -> list[str]:
    return [command for _, command, _ in system.envd.commands]


def _verbs(system: InMemorySystem) -> list[str]:
    return [p.verb for p in system.publisher.published]


async def test_hooks_run_in_order_around_capture_replay_and_delete(system: InMemorySystem) -> None:
    sid = "sbx-order"
    mine = _hooks(
        prePause={"command": "my-pre-pause"},
        postResume={"command": "my-post-resume"},
        preKill={"command": "my-pre-kill"},
    )
    await _create(system, sid, mine)
    await system.lifecycle.pause(sid, owner="alice", wait=5)
    assert _ran(system) == ["tpl-pre-pause", "my-pre-pause"]
    assert {u for _, _, u in system.envd.commands} == {"user"}
    verbs = _verbs(system)
    assert verbs.index("hook") < verbs.index("snapshotted")  # before the capture

    result = await system.lifecycle.resume(sid, owner="alice", wait=5)
    assert _ran(system)[2:] == ["tpl-post-resume", "my-post-resume"]
    report = result.record.last_resume
    assert report is not None and [h.source for h in report.hooks] == ["template", "sandbox"]
    assert all(h.ok and h.exit_code == 0 and h.hook == "postResume" for h in report.hooks)

    await system.lifecycle.kill(sid, owner="alice", wait=5)
    assert _ran(system)[4:] == ["tpl-pre-kill", "my-pre-kill"]
    verbs = _verbs(system)
    assert verbs.index("killed") > max(i for i, v in enumerate(verbs) if v == "hook")
    events = system.publisher.of_type(SandboxHookRan)
    assert [(e.op, e.outcome.hook) for e in events] == [
        ("pause", "prePause"),
        ("pause", "prePause"),
        ("resume", "postResume"),
        ("resume", "postResume"),
        ("kill", "preKill"),
        ("kill", "preKill"),
    ]


async def test_an_aborting_pre_pause_keeps_the_sandbox_running(system: InMemorySystem) -> None:
    sid = "sbx-abort"
    await _create(system, sid, _hooks(prePause={"command": "flush", "onFailure": "abort"}))
    system.envd.results["flush"] = CommandResult(
        exit_code=3, output="cannot flush with API_TOKEN=sk-live-0123456789abcdef\n"
    )
    with pytest.raises(PauseRefused) as refused:
        await system.lifecycle.pause(sid, owner="alice", wait=5)
    assert "exit code 3" in str(refused.value) and refused.value.hook["aborted"] is True
    record = await system.store.get(sid)
    assert record is not None and record.state == SandboxState.RUNNING
    assert record.refused_pause is not None and record.refused_pause.exit_code == 3
    assert "sk-live-0123456789abcdef" not in record.refused_pause.output
    assert system.runtime.workloads[sid].replicas == 1
    assert "snapshotted" not in _verbs(system) and "paused" not in _verbs(system)
    aborted = [e for e in system.publisher.of_type(SandboxHookRan) if e.outcome.aborted]
    assert len(aborted) == 1 and "sk-live" not in aborted[0].model_dump_json()

    # Once the hook succeeds, the next pause goes through and clears the reason.
    system.envd.results.pop("flush")
    paused = await system.lifecycle.pause(sid, owner="alice", wait=5)
    assert paused.state == SandboxState.PAUSED and paused.refused_pause is None


async def test_ignore_policy_records_the_failure_and_pauses(system: InMemorySystem) -> None:
    sid = "sbx-ignore"
    await _create(system, sid, _hooks(prePause={"command": "slow", "timeout": 2}))
    system.envd.results["slow"] = CommandResult(exit_code=None, output="...", timed_out=True)
    paused = await system.lifecycle.pause(sid, owner="alice", wait=5)
    assert paused.state == SandboxState.PAUSED
    (mine,) = [
        e.outcome for e in system.publisher.of_type(SandboxHookRan) if e.outcome.source == "sandbox"
    ]
    assert not mine.ok and not mine.aborted and mine.error == "timed out after 2s (killed)"


async def test_an_aborting_post_resume_fails_the_resume(system: InMemorySystem) -> None:
    sid = "sbx-post-abort"
    await _create(system, sid, _hooks(postResume={"command": "check", "onFailure": "abort"}))
    await system.lifecycle.pause(sid, owner="alice", wait=5)
    system.envd.results["check"] = CommandResult(exit_code=1)
    with pytest.raises(RuntimeFailure, match="postResume hook failed"):
        await system.lifecycle.resume(sid, owner="alice", wait=5)
    record = await system.store.get(sid)
    assert record is not None and record.state == SandboxState.FAILED


async def test_a_paused_sandbox_is_killed_without_its_pre_kill(system: InMemorySystem) -> None:
    sid = "sbx-kill-paused"
    await _create(system, sid, _hooks(preKill={"command": "bye"}))
    await system.lifecycle.pause(sid, owner="alice", wait=5)
    system.envd.commands.clear()
    await system.lifecycle.kill(sid, owner="alice", wait=5)
    assert system.envd.commands == []  # no pod to run it in
    record = await system.store.get(sid)
    assert record is not None and record.state == SandboxState.KILLED


async def test_a_failing_pre_kill_never_keeps_the_sandbox(system: InMemorySystem) -> None:
    sid = "sbx-kill-fail"
    await _create(system, sid, _hooks(preKill={"command": "bye"}))
    system.envd.down = True
    await system.lifecycle.kill(sid, owner="alice", wait=5)
    record = await system.store.get(sid)
    assert record is not None and record.state == SandboxState.KILLED


@pytest.mark.parametrize(
    ("hooks", "says"),
    [
        ({"prePause": {"command": "echo\x00rm -rf /"}}, "NUL"),
        ({"prePause": {"command": "echo \x1b[2J"}}, "control"),
        ({"prePause": {"command": "x" * 4097}}, "4096"),
        ({"prePause": {"command": "   "}}, "blank"),
        ({"prePause": {"command": "ok", "timeout": 0}}, "greater than or equal"),
        ({"prePause": {"command": "ok", "timeout": 10**9}}, "less than or equal"),
        ({"prePause": {"command": "ok", "onFailure": "--ro-bind"}}, "abort"),
        ({"preKill": {"command": "ok", "onFailure": "abort"}}, "never refused"),
        ({"preStart": {"command": "ok"}}, "Extra inputs"),
        ({"prePause": {"command": "ok", "user": "root"}}, "Extra inputs"),
    ],
)
def test_hostile_hooks_are_refused_naming_the_field(hooks: dict[str, Any], says: str) -> None:
    for model, extra in ((NewSandbox, {}), (NativeCreate, {})):
        with pytest.raises(ValidationError) as e:
            model.model_validate({"hooks": hooks, **extra})
        assert says in str(e.value) and "hooks" in str(e.value)


T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("reason", "after", "honoured"),
    [
        ("user", 10**6, True),  # the owner's own pause: its hook may always refuse it
        ("timeout", 0, True),
        ("timeout", 59, True),
        ("timeout", 60, False),  # at maxLifetime the operator's bound wins
        ("timeout", 10**6, False),
        ("platform", 60, False),
    ],
)
def test_a_pre_pause_abort_refuses_a_timeout_pause_only_within_max_lifetime(
    reason: PauseReason, after: int, honoured: bool
) -> None:
    at = T0 + timedelta(seconds=after)
    assert abort_honoured(reason, started_at=T0, max_lifetime=60, at=at) is honoured


def test_an_overridden_abort_is_recorded_but_does_not_stop_the_pause() -> None:
    hook = Hook(command="exit 1", on_failure="abort")
    failed = CommandResult(exit_code=1, output="no")
    outcome = outcome_of("prePause", "sandbox", hook, failed, duration_ms=1, may_abort=False)
    assert (outcome.ok, outcome.aborted, outcome.overridden) == (False, False, True)
    assert refusal([outcome]) is None
    honoured = outcome_of("prePause", "sandbox", hook, failed, duration_ms=1)
    assert (honoured.aborted, honoured.overridden) == (True, False)
    assert refusal([honoured]) == honoured
    ok = outcome_of("prePause", "sandbox", hook, CommandResult(exit_code=0), duration_ms=1)
    assert not ok.aborted and not ok.overridden
