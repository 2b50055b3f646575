"""Pure decisions: the state-machine mutations and the replay plan."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared.domain import transitions as t
from shared.domain.record import SandboxRecord, SnapshotRef
from shared.domain.states import SandboxState
from shared.errors import IllegalTransition
from shared.lifecycle.replay import plan, replay_key
from shared.models.snapshots import ProcessConfig, Snapshot, SnapshotProcess

pytestmark = pytest.mark.unit

NOW = datetime.now(UTC)


def rec(state: SandboxState, generation: int = 3, **kw: object) -> SandboxRecord:
    return SandboxRecord(
        sandbox_id="sbx",
        owner="alice",
        state=state,
        generation=generation,
        created_at=NOW,
        started_at=NOW,
        updated_at=NOW,
        **kw,  # type: ignore[arg-type]
    )


def proc(arg: str, pid: int, tag: str | None = None) -> SnapshotProcess:
    return SnapshotProcess(
        config=ProcessConfig(cmd="/bin/bash", args=["-l", "-c", arg], cwd="/workspace"),
        pid=pid,
        tag=tag,
    )


def test_begin_pause_takes_ownership_and_redelivery_continues() -> None:
    r = t.begin("pause", "pause:sbx:g3", generation=3)(rec(SandboxState.RUNNING))
    assert r.state == SandboxState.PAUSING
    assert r.pending is not None and r.pending.cmd_msg_id == "pause:sbx:g3"
    assert t.begin("pause", "pause:sbx:g3", generation=3)(r) is r  # redelivery: same record
    with pytest.raises(IllegalTransition):
        t.begin("pause", "other-id", generation=3)(r)  # someone else's pause in flight


@pytest.mark.parametrize("state", [SandboxState.PAUSED, SandboxState.KILLED, SandboxState.CREATING])
def test_pause_only_from_running(state: SandboxState) -> None:
    with pytest.raises(IllegalTransition):
        t.begin("pause", "p", generation=3)(rec(state))


def test_stale_generation_is_refused() -> None:
    with pytest.raises(IllegalTransition, match="stale"):
        t.begin("resume", "r", generation=2)(rec(SandboxState.PAUSED))
    # user kills ignore the generation
    assert (
        t.begin("kill", "k", generation=None)(rec(SandboxState.PAUSED)).state
        == SandboxState.KILLING
    )


def test_resume_from_failed_and_running_bumps_generation_with_full_timeout() -> None:
    r = t.begin("resume", "r", generation=3)(rec(SandboxState.FAILED, failure="pause: x"))
    done = t.running(op="resume", cmd_msg_id="r", host="127.0.0.9", pod_uid="u", timeout=60)(r)
    assert done.state == SandboxState.RUNNING and done.generation == 4 and done.failure is None
    assert done.deadline is not None and timedelta(
        seconds=59
    ) < done.deadline - t.now() <= timedelta(seconds=60)
    assert done.timeout == 60 and done.pending is None


def test_paused_requires_a_snapshot_of_this_pause() -> None:
    pausing = t.begin("pause", "p", generation=3)(rec(SandboxState.RUNNING))
    with pytest.raises(IllegalTransition):
        t.paused(generation=3, retention=timedelta(days=30))(pausing)  # no snapshot yet
    old = SnapshotRef(
        id="old", captured_at="2020-01-01T00:00:00.000000000Z", process_count=0, annotation="e30="
    )
    with pytest.raises(IllegalTransition):  # a previous pause's snapshot does not count
        t.paused(generation=3, retention=timedelta(days=30))(
            pausing.model_copy(update={"snapshot": old})
        )
    snap = Snapshot.capture([], at=t.now())
    ref = SnapshotRef(
        id=snap.id, captured_at=snap.captured_time, process_count=0, annotation=snap.encode()
    )
    done = t.paused(generation=3, retention=timedelta(days=30))(t.store_snapshot("p", ref)(pausing))
    assert done.state == SandboxState.PAUSED and done.generation == 4
    assert done.snapshot == ref.model_copy(update={"pause_msg_id": "p"})
    assert done.retain_until is not None and done.host is None and done.deadline is None


def test_a_previous_pause_capture_moments_ago_is_not_this_pause_s() -> None:
    """Pause, resume, pause again within a second: the second pause must capture afresh (it
    took the first capture for its own and replayed the first life's processes)."""
    snap = Snapshot.capture([], at=t.now())
    ref = SnapshotRef(
        id=snap.id, captured_at=snap.captured_time, process_count=0, annotation=snap.encode()
    )
    first = t.store_snapshot("p1", ref)(
        t.begin("pause", "p1", generation=3)(rec(SandboxState.RUNNING))
    )
    # Resumed and running again (generation 5), still carrying the first capture.
    again = first.model_copy(
        update={"state": SandboxState.RUNNING, "pending": None, "generation": 5}
    )
    second = t.begin("pause", "p2", generation=5)(again)
    assert t.snapshot_of_this_pause(second) is None
    with pytest.raises(IllegalTransition):
        t.paused(generation=5, retention=timedelta(days=30))(second)
    assert t.snapshot_of_this_pause(t.store_snapshot("p2", ref)(second)) is not None


def test_failed_only_for_the_owner() -> None:
    pausing = t.begin("pause", "p", generation=3)(rec(SandboxState.RUNNING))
    with pytest.raises(IllegalTransition):
        t.failed("pause", "x", cmd_msg_id="other")(pausing)
    f = t.failed("pause", "daemon down", cmd_msg_id="p")(pausing)
    assert (
        f.state == SandboxState.FAILED and f.failure == "pause: daemon down" and f.generation == 4
    )


def test_captured_time_parses_with_nanoseconds() -> None:
    at = t.parse_captured_time("2026-09-03T03:25:21.201354569Z")
    assert at == datetime(2026, 9, 3, 3, 25, 21, 201354, tzinfo=UTC)


def test_replay_plan_skips_what_already_runs_in_order_with_multiplicity() -> None:
    snapshot = [proc("a", 1), proc("b", 2), proc("a", 3), proc("c", 4, tag="t")]
    running = [proc("a", 50), proc("c", 51)]  # untagged c is not the tagged one
    steps = plan(snapshot, running)
    assert [s.process.pid for s in steps] == [1, 2, 3, 4]
    assert [s.running_pid for s in steps] == [50, None, None, None]


def test_replay_key_is_per_pod() -> None:
    assert replay_key("s1", "pod-a") != replay_key("s1", "pod-b")
