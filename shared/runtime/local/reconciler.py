"""The local runtime's ReplicaSet controller: makes pod processes match the workload records.

It starts a pod when ``replicas`` is 1 and none runs (crashed pods are restarted with a
back-off), stops pods of workloads scaled to 0 or deleted, and at start-up stops strays (pods of
this data dir that no record knows), releases addresses of workloads that are gone and removes
network namespaces, links and rules no live pod uses. A pod's network (:mod:`.network`) is made
before its processes start and removed after they stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any

import structlog

from shared.errors import Conflict, NotFound, RuntimeFailure
from shared.runtime.local import procfs
from shared.runtime.local.addresses import AddressPool
from shared.runtime.local.launcher import PodLauncher
from shared.runtime.local.memory import MemoryPauses
from shared.runtime.local.network import PodNetwork
from shared.runtime.local.network.names import pod_net_id
from shared.runtime.local.pools import Pools, is_pool_name
from shared.runtime.local.records import PodRecord, WorkloadRecord, WorkloadStore
from shared.runtime.local.userns import IdRangePool

log = structlog.get_logger()

_BACKOFF_MAX = 30.0
_SWEEP_EVERY = 10.0  # seconds between periodic stray sweeps: a stray goes within about 20 s


class Reconciler:
    def __init__(
        self,
        *,
        store: WorkloadStore,
        addresses: AddressPool,
        id_ranges: IdRangePool,
        launcher: PodLauncher,
        network: PodNetwork,
        poll_interval: float,
        pools: Mapping[str, int] | None = None,
        template_dirs: list[Path] | None = None,
        pool_claim_timeout: float = 30.0,
        memory: MemoryPauses | None = None,
    ) -> None:
        self._store = store
        self._memory = memory
        self._addresses = addresses
        self._id_ranges = id_ranges
        self._launcher = launcher
        self._network = network
        self._poll_interval = poll_interval
        self._locks: dict[str, asyncio.Lock] = {}
        self._pending: set[str] = set()
        self._starting: dict[str, str] = {}  # pod uids spawned but not yet recorded: workload
        self._suspects: set[str] = set()  # pod uids the last sweep found no record of
        self.pools = (
            Pools(
                sizes=pools,
                store=store,
                addresses=addresses,
                id_ranges=id_ranges,
                launcher=launcher,
                network=network,
                template_dirs=template_dirs or [],
                kick=self.kick,
                claim_timeout=pool_claim_timeout,
            )
            if pools
            else None
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    def start_monitor(self) -> None:
        self._spawn_task(self._monitor())

    async def close(self) -> None:
        """Stop reconciling (pods keep running)."""
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
        if self.pools is not None:
            await self.pools.close()

    def kick(self, name: str, *, after: float = 0.0) -> None:
        """Schedule one reconcile of ``name`` (coalesced with any already queued)."""
        if self._closing:
            return
        if after == 0.0:
            if name in self._pending:
                return
            self._pending.add(name)

        async def run() -> None:
            if after:
                await asyncio.sleep(after)
            try:
                await self.reconcile(name)
            except Exception:
                log.exception("runtime_local_reconcile_failed", workload=name)

        self._spawn_task(run())

    async def reconcile(self, name: str) -> None:
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            self._pending.discard(name)
            try:
                while await self._step(name):
                    pass
            except NotFound:  # deleted meanwhile (by another runtime)
                return
            except RuntimeFailure as e:
                # E.g. a pod that did not die yet: the record keeps it, the next pass retries.
                log.warning("runtime_local_reconcile_retry", workload=name, error=str(e))
                self.kick(name, after=1.0)

    async def reconcile_all(self, *, stray_sweep: bool) -> None:
        names = await self._store.names()
        for name in names:
            current = await self._store.get(name)
            if current is not None and _needs_work(current[0]):
                self.kick(name)
        if stray_sweep:
            await self.sweep_leftovers()
            await self._addresses.release_orphans(set(names))
            await self._id_ranges.release_orphans(set(names))
            for orphan in await asyncio.to_thread(self._launcher.layers.names):
                # Its workload was deleted while no runtime ran (looked up again: it may have
                # been created since ``names`` was read).
                if orphan not in names and await self._store.get(orphan) is None:
                    await self._launcher.delete_layer(orphan)

    async def apply_network(self, name: str) -> None:
        """Give the workload's running pod the record's current policy (a live change)."""
        applied = None
        async with self._locks.setdefault(name, asyncio.Lock()):
            # Again until the record holds what was applied: another process may have
            # written a newer policy (and applied it) while this one applied an older one.
            while True:
                current = await self._store.get(name)
                pod = current[0].pod if current is not None else None
                if current is None or pod is None or pod.address is None:
                    return
                if current[0].network == applied:
                    return
                applied = current[0].network
                await self._network.apply_policy(pod_net_id(pod.uid), pod.address, applied)

    async def sweep_leftovers(self, *, confirmed: bool = False) -> None:
        """Stop this data dir's pods that no record knows; keep the network of every recorded
        pod still running (adopted after a restart) and remove the rest of this instance's
        namespaces, links and rules. ``confirmed`` (the periodic sweep): a pod is stopped only
        when the previous sweep found it unknown too, so one odd read never stops a pod, and the
        network is swept only when a pod was stopped (not every few seconds, beside live pods).

        Another process of this instance may be starting or claiming a pod meanwhile: the pods
        are listed first, under the sweep lock (a start records its pod before it lets go of
        that lock), and the records after, the pools' before the sandboxes' (a claimed pod is
        on the sandbox's record before it leaves the pool's), so no such pod looks unknown."""
        async with self._network.sweep_lock():
            running = await self._launcher.scan()
            records = await self._records()
            known = {pod.uid for record in records for pod in record.pods()}
            unknown = {uid for uid in running if uid not in known and uid not in self._starting}
            suspects, self._suspects = self._suspects, unknown
            strays = sorted(unknown & suspects if confirmed else unknown)
            for uid in strays:
                log.info("runtime_local_stray_stopped", pod_uid=uid)
                await self._launcher.stop_stray(uid)
            if confirmed and not strays:
                return  # the periodic pass: the network is swept only after it stopped a pod
            keep = {}
            for record in records:
                for pod in record.pods():
                    alive = procfs.is_pod_alive(pod.pid, pod.uid, pod.start_ticks)
                    if pod.address is not None and alive:
                        keep[pod_net_id(pod.uid)] = (pod.address, record.network)
            await self._network.sweep(keep)

    async def _records(self) -> list[WorkloadRecord]:
        """Every record, read now: the pools' first (see ``sweep_leftovers``)."""
        names = sorted(await self._store.names(), key=lambda n: not is_pool_name(n))
        records = []
        for name in names:
            current = await self._store.get(name)
            if current is not None:
                records.append(current[0])
        return records

    async def stop_everything(self) -> None:
        """Stop every pod of this data dir; ``replicas`` stay, so the next start restarts them."""
        for name in await self._store.names():
            current = await self._store.get(name)
            if current is None:
                continue
            for pod in current[0].pods():
                await self._discard(pod)

            def change(r: WorkloadRecord) -> WorkloadRecord:
                return r.model_copy(update={"pod": None, "terminating": []})

            with contextlib.suppress(NotFound):
                await self._store.mutate(name, change)
        await self.stop_every_pod()

    async def stop_every_pod(self) -> None:
        """Stop every pod of this data dir, recorded or not (reads no record: NATS may be gone)."""
        for uid in await self._launcher.scan():
            await self._launcher.stop_stray(uid)

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _monitor(self) -> None:
        # Checks _closing too: nats-py can turn a cancellation into another exception.
        swept = time.monotonic()
        while not self._closing:
            await asyncio.sleep(self._poll_interval)
            try:
                await self.reconcile_all(stray_sweep=False)
                if time.monotonic() - swept >= _SWEEP_EVERY:
                    # A pod a crash left between its start and its record (this or another
                    # process of the instance) is stopped without waiting for a restart.
                    swept = time.monotonic()
                    await self.sweep_leftovers(confirmed=True)
                if self.pools is not None:
                    await self.pools.refill(busy=self._starting_sandbox)
            except Exception:
                log.exception("runtime_local_monitor_failed")

    def _starting_sandbox(self) -> bool:
        """Whether a sandbox's (not a pool's) pod is being started here right now."""
        return any(not is_pool_name(name) for name in self._starting.values())

    async def _step(self, name: str) -> bool:
        """One step towards the record's desired state; True when another step is needed."""
        current = await self._store.get(name)
        if current is None:
            return False
        record, revision = current
        if record.pool is not None and record.pool.claimed_by and not record.deleting:
            if self.pools is not None:
                await self.pools.claimed_step(record)
            return False
        if record.terminating:
            for pod in record.terminating:
                if self._memory is not None and _pausing(record, pod):
                    # A pause: the tree is dumped (or why not noted) before its teardown.
                    enter = self._network.enter_prefix(pod_net_id(pod.uid))
                    await self._memory.dump(record, pod, enter)
                await self._discard(pod)
            gone = {p.uid for p in record.terminating}
            await self._store.mutate(
                name,
                lambda r: r.model_copy(
                    update={"terminating": [p for p in r.terminating if p.uid not in gone]}
                ),
            )
            return True
        if record.deleting:
            if record.pod is None:
                await self._launcher.delete_layer(name)  # kept files go with the sandbox
                with contextlib.suppress(Conflict):
                    await self._store.remove(name, last=revision)
                    # Only while still its own: a claimed warm pod's went to the claimer.
                    await self._addresses.release_held(record.address, name)
                    if record.id_base is not None:
                        await self._id_ranges.release_held(record.id_base, name)
                    log.info("runtime_local_deleted", workload=name)
                    return False
                return True
            await self._store.mutate(name, _pod_to_terminating)
            return True
        if record.replicas == 0:
            if record.pod is not None:
                await self._store.mutate(name, _pod_to_terminating)
                return True
            return False
        if record.pod is not None:
            if procfs.is_pod_alive(record.pod.pid, record.pod.uid, record.pod.start_ticks):
                claim = record.pod.claim
                if claim is not None and not claim.bound and self.pools is not None:
                    wait = await self.pools.finish(record, revision)
                    if wait is None:
                        return True
                    self.kick(name, after=wait)
                return False
            await self._pod_died(record)
            return True
        wait = record.not_before - time.time()
        if wait > 0:
            self.kick(name, after=wait)
            return False
        restoring = self._memory is not None and self._memory.has_images(name)
        if not restoring and self.pools is not None and await self.pools.claim(record):
            return True  # a warm pod: the next step binds it
        await self._start_pod(record)
        return False

    async def _pod_died(self, record: WorkloadRecord) -> None:
        dead = record.pod
        assert dead is not None
        backoff = min(0.5 * 2**record.restarts, _BACKOFF_MAX)
        log.warning(
            "runtime_local_pod_died", workload=record.name, pod_uid=dead.uid, restart_in=backoff
        )

        def change(r: WorkloadRecord) -> WorkloadRecord | None:
            if r.pod is None or r.pod.uid != dead.uid:
                return None
            # Through ``terminating``: should the pod not be dead after all (or leave a
            # process behind), it is stopped, and retried until it is gone.
            return r.model_copy(
                update={
                    "pod": None,
                    "terminating": [*r.terminating, dead],
                    "restarts": r.restarts + 1,
                    "not_before": time.time() + backoff,
                }
            )

        await self._launcher.keep_log(dead, record.name)
        await self._store.mutate(record.name, change)

    async def _start_pod(self, record: WorkloadRecord) -> None:
        if record.id_base is None:  # a record from before id ranges
            record = await self._give_id_range(record)
        record = await self._usable_address(record)
        # A paused tree comes back as the pod it was (its folders, cgroups and net id by uid).
        # A fresh start is a new pod with a new uid, also after a failed restore: the scaler
        # would take the dumped pod's uid for a pod that still runs the snapshot's processes.
        uid = self._memory.restorable_uid(record) if self._memory else None
        note = None
        if uid is not None:
            note = await self._start_pod_as(record, uid, restoring=True)
            if note is None:
                return
        await self._start_pod_as(record, str(uuid.uuid4()), restoring=False, note=note)

    async def _start_pod_as(
        self, record: WorkloadRecord, uid: str, *, restoring: bool, note: str | None = None
    ) -> str | None:
        """Start the workload's pod as ``uid``: its paused tree when ``restoring``, else fresh
        (saying ``note`` of the memory it lost). A restore that failed leaves no pod and
        returns why."""
        net_id = pod_net_id(uid)
        async with self._network.address_lock(record.address):
            # Under the lock: another reconciler (another service) may have started it.
            fresh = await self._store.get(record.name)
            if fresh is None or not _wants_pod(fresh[0]) or fresh[0].address != record.address:
                return None
            record = fresh[0]
            self._starting[uid] = record.name
            try:
                try:
                    await self._network.setup(net_id, record.address, record.network)
                    try:
                        started = await self._restore_or_start(
                            record, uid, net_id, restoring=restoring, note=note
                        )
                    except Exception:
                        await self._network.teardown(net_id, record.address)
                        raise
                    if isinstance(started, str):  # the restore failed: a new pod starts
                        await self._network.teardown(net_id, record.address)
                        return started
                    pod, process = started
                except RuntimeFailure:
                    await self._start_failed(record)
                    raise
                pod = pod.model_copy(update={"address": record.address})

                def change(r: WorkloadRecord) -> WorkloadRecord | None:
                    return r.model_copy(update={"pod": pod}) if _wants_pod(r) else None

                try:
                    current, _ = await self._store.mutate(record.name, change)
                except BaseException:
                    # Deleted meanwhile (NotFound), NATS gone, cancelled: a pod no record
                    # names would run on as a stray. Should the write have landed after all,
                    # the record's pod is dead and the next pass starts another.
                    await asyncio.shield(self._discard(pod))
                    raise
            finally:
                self._starting.pop(uid, None)
        if current.pod is None or current.pod.uid != uid:  # scaled to 0 or deleted meanwhile
            await self._discard(pod)
            return None
        if current.network != record.network:  # changed while the pod was starting
            await self.apply_network(record.name)
        log.info("runtime_local_pod_started", workload=record.name, pod_uid=uid, pid=pod.pid)
        if process is not None:  # a restored tree is not this process's child: polled
            self._spawn_task(self._watch_exit(record.name, process))
        return None

    async def _restore_or_start(
        self, record: WorkloadRecord, uid: str, net_id: str, *, restoring: bool, note: str | None
    ) -> tuple[PodRecord, asyncio.subprocess.Process | None] | str:
        """The workload's paused tree restored (``restoring``), else a fresh pod that says why
        not; a failed restore returns its reason instead (its pod must get a new uid)."""
        enter = self._network.enter_prefix(net_id)
        if self._memory is not None and note is None:
            restored, note = await self._memory.restore(record, uid, enter)
            if restored is not None:
                return restored, None
            if restoring:
                return note or "the restore failed"
        pod, process = await self._launcher.start(record, uid, enter=enter)
        return (pod.model_copy(update={"memory_note": note}) if note else pod), process

    async def _usable_address(self, record: WorkloadRecord) -> WorkloadRecord:
        """The record, with a new address when its own is not in the current pod range."""
        if self._addresses.usable(record.address):
            return record
        address = await self._addresses.reserve(record.name)
        old = record.address

        def change(r: WorkloadRecord) -> WorkloadRecord | None:
            return r.model_copy(update={"address": address}) if r.address == old else None

        current, _ = await self._store.mutate(record.name, change)
        if current.address != address:  # readdressed by someone else meanwhile
            await self._addresses.release(address)
        else:
            await self._addresses.release(old)
            log.info("runtime_local_readdressed", workload=record.name, old=old, new=address)
        return current

    async def _discard(self, pod: PodRecord) -> None:
        """Stop and remove a pod, then its network (only once no process is left in it: a
        ``RuntimeFailure`` from the launcher keeps both for the next try)."""
        await self._launcher.cleanup(pod)
        if pod.address is not None:
            await self._network.teardown(pod_net_id(pod.uid), pod.address)

    async def _start_failed(self, record: WorkloadRecord) -> None:
        """Back off like after a crash, so a pod that cannot start is not retried every poll."""
        backoff = min(0.5 * 2**record.restarts, _BACKOFF_MAX)

        def change(r: WorkloadRecord) -> WorkloadRecord | None:
            if r.pod is not None:
                return None
            return r.model_copy(
                update={"restarts": r.restarts + 1, "not_before": time.time() + backoff}
            )

        await self._store.mutate(record.name, change)

    async def _give_id_range(self, record: WorkloadRecord) -> WorkloadRecord:
        base = await self._id_ranges.reserve(record.name)

        def change(r: WorkloadRecord) -> WorkloadRecord | None:
            return None if r.id_base is not None else r.model_copy(update={"id_base": base})

        current, _ = await self._store.mutate(record.name, change)
        if current.id_base != base:
            await self._id_ranges.release(base)
        return current

    async def _watch_exit(self, name: str, process: asyncio.subprocess.Process) -> None:
        await process.wait()  # also reaps the child
        self.kick(name)


def _needs_work(record: WorkloadRecord) -> bool:
    if record.terminating or record.deleting:
        return True
    if record.pool is not None and record.pool.claimed_by:
        return True  # a claim to finish, or an abandoned one to clean up
    claim = record.pod.claim if record.pod is not None else None
    if claim is not None and not claim.bound:
        return claim.lease_until <= time.time()  # else its binder is at it
    if record.replicas == 0:
        return record.pod is not None
    if record.pod is None:
        return record.not_before <= time.time()  # else a delayed reconcile is already queued
    return not procfs.is_pod_alive(record.pod.pid, record.pod.uid, record.pod.start_ticks)


def _pausing(record: WorkloadRecord, pod: PodRecord) -> bool:
    """Whether stopping ``pod`` is a pause (scaled to 0, kept): the pod the scale took, alive."""
    return (
        record.replicas == 0
        and not record.deleting
        and record.pool is None
        and pod is record.terminating[-1]
        and procfs.is_pod_alive(pod.pid, pod.uid, pod.start_ticks)
    )


def _wants_pod(record: WorkloadRecord) -> bool:
    return record.pod is None and record.replicas == 1 and not record.deleting


def _pod_to_terminating(record: WorkloadRecord) -> WorkloadRecord | None:
    if record.pod is None:
        return None
    return record.model_copy(update={"pod": None, "terminating": [*record.terminating, record.pod]})
