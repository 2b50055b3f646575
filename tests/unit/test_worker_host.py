"""The worker host's pieces: the one retry policy, the give-up rule, the per-sandbox lock. (The
scheduler's batch handlers: tests/unit/test_scheduler_batches.py.)"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from shared.bus.retry import DEFAULT, PoisonMessage, RetryPolicy
from shared.bus.topology import DURABLES, SCHEDULER_FIRED, SNAPSHOTTER_PAUSE, retry_policy_of
from shared.errors import RuntimeFailure, SnapshotTooLarge
from shared.lifecycle.worker import SandboxLocks, guarded
from shared.models.messages import (
    CreateSandbox,
    PauseSandbox,
    SandboxKilled,
    SandboxTimeoutSet,
    address,
)
from shared.ports.bus import emit
from tests.fakes.clock import FakeClock
from tests.fakes.publisher import RecordingPublisher

pytestmark = pytest.mark.unit


class Body(BaseModel):
    n: int


def validation_error() -> ValidationError:
    try:
        Body.model_validate({"n": "--ro-bind"})
    except ValidationError as e:
        return e
    raise AssertionError("unreachable")


# ---- the retry policy -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        PoisonMessage("subject and body differ"),
        validation_error(),
        json.JSONDecodeError("x", "", 0),
    ],
)
def test_what_the_message_did_wrong_is_dead_lettered_at_once(error: Exception) -> None:
    assert DEFAULT.on_error(error, 1) == ("dead_letter", 0.0)


@pytest.mark.parametrize("error", [ValueError("from handler code"), RuntimeError("daemon down")])
def test_handler_failures_are_retried_with_growing_bounded_delays(error: Exception) -> None:
    delays = []
    for n in range(1, DEFAULT.dead_letter_after):
        action, delay = DEFAULT.on_error(error, n)
        assert action == "retry"
        delays.append(delay)
    assert 1.6 <= delays[0] <= 2.4 and max(delays) <= DEFAULT.max_delay * 1.2
    assert delays[-1] > delays[0]
    assert DEFAULT.on_error(error, DEFAULT.dead_letter_after)[0] == "dead_letter"


@pytest.mark.parametrize(
    "limits",
    [
        {"give_up_after": 0},
        {"dead_letter_after": 13},  # beyond max_deliver: never reached
        {"ack_wait": 0},
        {"heartbeat": 30},  # a heartbeat must come within ack_wait
    ],
)
def test_inconsistent_limits_are_refused(limits: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must"):
        RetryPolicy(**limits)


def test_every_durable_carries_its_policy_into_the_consumer_and_the_middleware() -> None:
    for durable in DURABLES:
        config = durable.config()
        assert config.ack_wait == durable.retry.ack_wait
        assert config.max_deliver == durable.retry.max_deliver
        assert retry_policy_of(durable.name) is durable.retry
    assert SCHEDULER_FIRED.retry.ack_wait == 10 and SNAPSHOTTER_PAUSE.retry.ack_wait == 30
    assert retry_policy_of(None) is DEFAULT and retry_policy_of("other-durable") is DEFAULT
    assert DEFAULT.heartbeat_every == 10
    tuned = DEFAULT.tuned(give_up_after=3, heartbeat=5)
    assert (tuned.give_up_after, tuned.heartbeat_every) == (3, 5)


# ---- give up ----------------------------------------------------------------------------------


class Delivery:
    """Just enough of a NatsMessage for ``guarded``: its delivery count."""

    def __init__(self, n: int) -> None:
        self.raw_message = type("Raw", (), {"metadata": type("Md", (), {"num_delivered": n})})()


async def _run(error: Exception, delivery: int, policy: RetryPolicy = DEFAULT) -> list[str]:
    failed: list[str] = []

    async def work() -> None:
        raise error

    async def fail(reason: str) -> None:
        failed.append(reason)

    await guarded(work, msg=Delivery(delivery), retry=policy, fail=fail)
    return failed


async def test_guarded_retries_then_fails_the_transition_on_the_record() -> None:
    with pytest.raises(ConnectionError):
        await _run(ConnectionError("envd"), 4)
    assert await _run(ConnectionError("envd"), 5) == ["ConnectionError: envd"]
    assert await _run(SnapshotTooLarge("over the annotation budget"), 1) == [
        "over the annotation budget"
    ]


async def test_a_validation_error_from_the_work_is_retried_not_dead_lettered() -> None:
    with pytest.raises(RuntimeFailure) as caught:
        await _run(validation_error(), 1)
    assert DEFAULT.on_error(caught.value, 1)[0] == "retry"


async def test_sandbox_locks_serialise_one_sandbox_and_forget_it_after() -> None:
    locks = SandboxLocks()
    order: list[str] = []

    async def hold(sid: str, tag: str) -> None:
        async with locks.hold(sid):
            order.append(f"{tag}+")
            await asyncio.sleep(0.01)
            order.append(f"{tag}-")

    await asyncio.gather(hold("a", "a1"), hold("a", "a2"), hold("b", "b1"))
    assert order.index("a1-") < order.index("a2+")  # never both inside for one sandbox
    assert order.index("b1+") < order.index("a1-")  # other sandboxes do not wait
    assert len(locks) == 0


# ---- one way to publish -----------------------------------------------------------------------


def test_commands_and_events_are_addressed_by_what_they_are() -> None:
    at = FakeClock()()
    pause = PauseSandbox(sandbox_id="sbx1", generation=3)
    assert address(pause) == ("sandbox.cmd.pause.sbx1", "pause:sbx1:g3")
    assert address(pause, "a2") == ("sandbox.cmd.pause.sbx1", "pause:sbx1:g3:a2")
    create = CreateSandbox(sandbox_id="sbx1", owner="alice")
    assert address(create, generation=0) == ("sandbox.cmd.create.sbx1", "create:sbx1:g0")
    timeout_set = SandboxTimeoutSet(sandbox_id="sbx1", generation=2, at=at, deadline=at)
    assert address(timeout_set, "x") == ("sandbox.evt.timeout_set.sbx1", "timeout_set:sbx1:g2:x")
    with pytest.raises(TypeError, match="generation"):
        address(create)  # a create's generation is the record's: it must be given
    with pytest.raises(TypeError):
        address(Body(n=1))


async def test_emit_publishes_once_per_derived_id() -> None:
    publisher = RecordingPublisher()
    killed = SandboxKilled(sandbox_id="sbx1", generation=4, at=FakeClock()())
    assert await emit(publisher, killed)
    assert not await emit(publisher, killed)  # a redelivered handler publishing again
    (out,) = publisher.published
    assert (out.subject, out.msg_id, out.message) == (
        "sandbox.evt.killed.sbx1",
        "killed:sbx1:g4",
        killed,
    )
