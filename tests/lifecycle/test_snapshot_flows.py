"""Stored snapshots through the real bus with two replicas of each worker (fake runtime and
daemon): duplicate and redelivered commands leave one ready snapshot, one copy of its files and
one replay per new pod; delete is idempotent and spares sandboxes started from the snapshot; the
owner and quota rules; a runtime that cannot keep files refuses the snapshot (and leaves no record
behind)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from shared.bus import subjects
from shared.bus.broker import key_value, make_broker, prepare
from shared.bus.snapshot_store import KvSnapshotStore
from shared.bus.topology import KV_SNAPSHOTS
from shared.domain.states import SandboxState
from shared.errors import NotFound, QuotaExceeded, Unsupported
from shared.lifecycle.snapshots import SnapshotService, origin_of
from shared.models.messages import DeleteSnapshot, TakeSnapshot
from shared.models.snapshot_records import SnapshotState
from shared.models.snapshots import ProcessConfig, SnapshotProcess
from shared.ports.lifecycle import CreateRequest
from shared.ports.workloads import Endpoint
from shared.settings import BusSettings
from tests.fakes.runtime import FakeEnvd, FakeRuntime
from tests.lifecycle.harness import System, running_system

PROCS = [
    SnapshotProcess(
        config=ProcessConfig(cmd="/bin/bash", args=["-l", "-c", f"sleep 200{i}"], cwd="/workspace"),
        pid=i,
    )
    for i in range(2)
]


@contextlib.asynccontextmanager
async def _snapshots(
    system: System, nats_url: str
) -> AsyncIterator[tuple[SnapshotService, KvSnapshotStore]]:
    bus = BusSettings(nats_url=nats_url)
    broker = make_broker(bus, service="test-snapshots")
    await prepare(broker, bus)
    await broker.start()
    try:
        store = KvSnapshotStore(await key_value(broker, KV_SNAPSHOTS))
        yield SnapshotService(system.store, store, system.publisher), store
    finally:
        await broker.stop()


async def _running(system: System, envd: FakeEnvd, sid: str) -> Endpoint:
    rec = await system.lifecycle.create(CreateRequest(owner="alice", sandbox_id=sid), wait=20)
    assert rec.state == SandboxState.RUNNING and rec.host and rec.pod_uid
    envd.pods[rec.pod_uid] = list(PROCS)
    return Endpoint(host=rec.host, pod_uid=rec.pod_uid)


async def test_duplicates_and_two_replicas(fresh_nats) -> None:  # type: ignore[no-untyped-def]
    runtime, envd = FakeRuntime(), FakeEnvd()
    async with running_system(fresh_nats.url, runtime, envd, replicas=2) as system:
        async with _snapshots(system, fresh_nats.url) as (service, store):
            await _running(system, envd, "src1")
            snap = await service.take("src1", owner="alice", wait=20)
            assert snap.state == SnapshotState.READY and snap.process_count == 2
            assert runtime.snapshot_files == {snap.snapshot_id: "src1"}
            # Redeliveries and a foreign duplicate of the take: nothing changes.
            take = TakeSnapshot(sandbox_id="src1", snapshot_id=snap.snapshot_id)
            for mid in ("dup-1", "dup-2", f"snapshot:src1:{snap.snapshot_id}"):
                await system.publisher.publish(
                    take, subjects.of(subjects.CMD_SNAPSHOT, "src1"), msg_id=mid
                )
            await asyncio.sleep(1.0)
            again = await store.get(snap.snapshot_id)
            assert again is not None and again.annotation == snap.annotation
            assert again.state == SnapshotState.READY
            # The source is untouched: still running, same generation.
            source = await system.store.get("src1")
            assert source is not None and source.state == SandboxState.RUNNING

            # Two sandboxes from it: each gets the files once and the processes once.
            for sid in ("copy1", "copy2"):
                rec = await system.lifecycle.create(
                    CreateRequest(
                        owner="alice",
                        sandbox_id=sid,
                        origin_snapshot_id=snap.snapshot_id,
                        origin=origin_of(snap),
                    ),
                    wait=20,
                )
                assert rec.state == SandboxState.RUNNING and rec.pod_uid
                assert envd.started[rec.pod_uid] == 2
                names = sorted(" ".join(p.config.args) for p in envd.pods[rec.pod_uid])
                assert names == sorted(" ".join(p.config.args) for p in PROCS)
            assert sorted(runtime.restored) == [
                (snap.snapshot_id, "copy1"),
                (snap.snapshot_id, "copy2"),
            ]

            # Delete, with duplicates: the record and files go, once.
            await service.delete(snap.snapshot_id, owner="alice")
            delete = DeleteSnapshot(sandbox_id="src1", snapshot_id=snap.snapshot_id)
            await system.publisher.publish(
                delete, subjects.of(subjects.CMD_SNAPSHOT_DELETE, "src1"), msg_id="dup-del"
            )
            for _ in range(100):
                if await store.get(snap.snapshot_id) is None:
                    break
                await asyncio.sleep(0.1)
            assert await store.get(snap.snapshot_id) is None
            assert snap.snapshot_id not in runtime.snapshot_files
            with pytest.raises(NotFound):
                await service.delete(snap.snapshot_id, owner="alice")
            # The sandboxes started from it are untouched.
            for sid in ("copy1", "copy2"):
                rec = await system.store.get(sid)
                assert rec is not None and rec.state == SandboxState.RUNNING


async def test_other_owner_and_quota(fresh_nats) -> None:  # type: ignore[no-untyped-def]
    runtime, envd = FakeRuntime(), FakeEnvd()
    async with running_system(fresh_nats.url, runtime, envd) as system:
        async with _snapshots(system, fresh_nats.url) as (base, store):

            async def one(_: str) -> int:
                return 1

            service = SnapshotService(
                system.store,
                store,
                system.publisher,
                max_snapshots=one,
                retention=timedelta(days=1),
            )
            await _running(system, envd, "src2")
            with pytest.raises(NotFound):
                await service.take("src2", owner="bob", wait=20)
            first = await service.take("src2", owner="alice", wait=20)
            with pytest.raises(QuotaExceeded):
                await service.take("src2", owner="alice", wait=20)
            # The refused one left no record; fork's own (internal) is not counted.
            assert [s.snapshot_id for s in await service.list(owner="alice")] == [first.snapshot_id]
            internal = await service.take("src2", owner="alice", internal=True, wait=20)
            assert internal.state == SnapshotState.READY
            assert internal.snapshot_id not in {s.snapshot_id for s in await base.list(owner=None)}
            with pytest.raises(NotFound):
                await service.get(first.snapshot_id, owner="bob")
            with pytest.raises(NotFound):
                await service.delete(first.snapshot_id, owner="bob")
            assert (
                await service.get(first.snapshot_id, owner="alice")
            ).snapshot_id == first.snapshot_id


class NoFilesRuntime(FakeRuntime):
    async def save_files(self, name: str, snapshot_id: str) -> int:
        raise Unsupported("snapshots with files need the kept-files storage, not yet on kubernetes")


async def test_runtime_without_files_refuses(fresh_nats) -> None:  # type: ignore[no-untyped-def]
    runtime, envd = NoFilesRuntime(), FakeEnvd()
    async with running_system(fresh_nats.url, runtime, envd) as system:
        async with _snapshots(system, fresh_nats.url) as (service, store):
            await _running(system, envd, "src3")
            with pytest.raises(Unsupported, match="not yet on kubernetes"):
                await service.take("src3", owner="alice", wait=20)
            for _ in range(100):  # the failed record is removed through the bus
                if not await store.list():
                    break
                await asyncio.sleep(0.1)
            assert await store.list() == []
            rec = await system.store.get("src3")
            assert rec is not None and rec.state == SandboxState.RUNNING
