"""Malformed bus messages are dead-lettered with the error; the workers keep going."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import nats
import pytest

from shared.bus.topology import STREAM_DLQ
from shared.domain.states import SandboxState
from shared.ports.lifecycle import CreateRequest
from tests.fakes.runtime import FakeEnvd, FakeRuntime
from tests.lifecycle.harness import System, running_system


@pytest.fixture
async def system(fresh_nats) -> AsyncIterator[System]:  # type: ignore[no-untyped-def]
    async with running_system(fresh_nats.url, FakeRuntime(), FakeEnvd()) as s:
        yield s


async def _dlq(url: str, want: int, timeout: float = 10) -> list[tuple[str, dict[str, str]]]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    found: list[tuple[str, dict[str, str]]] = []
    try:
        async with asyncio.timeout(timeout):
            while True:
                info = await js.stream_info(STREAM_DLQ)
                if info.state.messages >= want:
                    break
                await asyncio.sleep(0.1)
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            m = await js.get_msg(STREAM_DLQ, seq)
            found.append((m.subject, dict(m.headers or {})))
    finally:
        await nc.close()
    return found


async def test_malformed_commands_land_in_the_dlq(system: System, fresh_nats) -> None:  # type: ignore[no-untyped-def]
    nc = await nats.connect(fresh_nats.url)
    js = nc.jetstream()
    await js.publish("sandbox.cmd.pause.sbx-a", b"not json at all")
    await js.publish(
        "sandbox.cmd.resume.sbx-b", json.dumps({"sandbox_id": "sbx-b"}).encode()
    )  # no generation
    await js.publish(
        "sandbox.cmd.kill.sbx-c", json.dumps({"sandbox_id": "other", "generation": 1}).encode()
    )  # subject and body disagree
    await nc.close()
    dead = await _dlq(fresh_nats.url, 3)
    by_subject = {h["x-src-subject"]: (subject, h) for subject, h in dead}
    assert set(by_subject) == {
        "sandbox.cmd.pause.sbx-a",
        "sandbox.cmd.resume.sbx-b",
        "sandbox.cmd.kill.sbx-c",
    }
    assert by_subject["sandbox.cmd.pause.sbx-a"][0] == "sandbox.dlq.snapshotter-pause.sbx-a"
    assert "generation" in by_subject["sandbox.cmd.resume.sbx-b"][1]["x-error"]
    assert "different sandboxes" in by_subject["sandbox.cmd.kill.sbx-c"][1]["x-error"]
    # ...and the workers still serve good commands.
    rec = await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id="sbx-after"))
    assert rec.state == SandboxState.RUNNING
