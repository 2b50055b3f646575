"""Run the snapshotter and the scaler in-process (their real wiring) plus a lifecycle client."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from services.scaler.bootstrap import scaler_host
from services.scaler.settings import ScalerSettings
from services.snapshotter.bootstrap import snapshotter_host
from services.snapshotter.settings import SnapshotterSettings
from shared.bus.broker import key_value, make_broker, prepare
from shared.bus.publishing import BrokerPublisher
from shared.bus.records import KvSandboxStore
from shared.bus.topology import KV_SANDBOXES
from shared.domain.record import SandboxRecord
from shared.domain.states import SandboxState
from shared.lifecycle.hosting import Context, WorkerHost
from shared.lifecycle.service import SandboxLifecycle
from shared.ports.envd import Envd
from shared.ports.runtime import Runtime
from shared.ports.workloads import Workload
from shared.settings import BusSettings


@dataclass
class System:
    lifecycle: SandboxLifecycle
    store: KvSandboxStore
    publisher: BrokerPublisher
    runtime: Runtime
    envd: Envd
    hosts: list[WorkerHost] = field(default_factory=list)


async def pause_to_zero(
    system: System, sandbox_id: str, *, wait: float
) -> tuple[SandboxRecord, Workload]:
    """Pause alice's ``sandbox_id``: the paused record, and its workload, scaled to zero with no
    pod."""
    paused = await system.lifecycle.pause(sandbox_id, owner="alice", wait=wait)
    assert paused.state == SandboxState.PAUSED
    workload = await system.runtime.get(sandbox_id)
    assert workload is not None
    assert workload.replicas == 0
    assert workload.pod_uid is None
    return paused, workload


@contextlib.asynccontextmanager
async def running_system(
    nats_url: str,
    runtime: Runtime,
    envd: Envd,
    *,
    replicas: int = 1,
    give_up_after: int = 3,
    ready_timeout: float = 30.0,
) -> AsyncIterator[System]:
    bus = BusSettings(nats_url=nats_url)
    client = make_broker(bus, service="test-client")
    await prepare(client, bus)
    await client.start()
    store = KvSandboxStore(await key_value(client, KV_SANDBOXES))
    publisher = BrokerPublisher(client)
    hosts: list[WorkerHost] = []
    try:
        for _ in range(replicas):
            # A replica is a process of its own in production: its own context, and with it
            # its own metrics registry (one registry cannot hold two replicas' metrics).
            ctx = Context(bus=bus, runtime=runtime, envd=envd)
            hosts.append(
                snapshotter_host(
                    ctx, SnapshotterSettings(give_up_after=give_up_after, envd_timeout=5)
                )
            )
            hosts.append(
                scaler_host(
                    ctx,
                    ScalerSettings(
                        give_up_after=give_up_after, ready_timeout=ready_timeout, stop_timeout=30
                    ),
                )
            )
        for host in hosts:
            await host.start()
        yield System(
            lifecycle=SandboxLifecycle(store, publisher),
            store=store,
            publisher=publisher,
            runtime=runtime,
            envd=envd,
            hosts=hosts,
        )
    finally:
        for host in hosts:
            await host.stop()
        await client.stop()
