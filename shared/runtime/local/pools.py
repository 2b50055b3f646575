"""Warm pools: ready pods per template, claimed by a sandbox instead of starting one.

A pool pod is an ordinary workload record (``pool-<template hash>-<slot>``, with ``pool`` set)
whose pod the reconciler starts like any other, without the template's volumes and with a fresh
disk, its daemon holding a one-time token only the runtime knows. Slots make the size exact
across runtimes: a slot's record is created with a KV ``create``, so two refilling runtimes
never both fill it. Pool records belong to nobody (no owner, no quota).

A claim (:meth:`Pools.claim`, from the reconciler when a workload wants a pod) is two CAS steps:

1. the pool record: ``claimed_by`` set, only on an unclaimed ready one (one winner per pod);
2. the workload record: takes the pod, the pod's address and the pod's host id range, only while
   it still wants a pod (one pod per workload). The loser of either gives the pod up (it is
   discarded, never reused).

Then :meth:`Pools.finish` binds the pod to the sandbox (repeatable, so a crash anywhere in it is
finished by the next reconcile): the reservations move to the workload; its disk: a new
sandbox takes the pod's fresh layer (the folder is renamed; the mount moves with it), a paused
one gets its kept layer as the pod's root (its files take the pod's ids, the pod's processes are
moved onto it by ``pivot_root``: :func:`.inject.switch_root`); its volumes are bound into the pod
and the pod gets its hostname and ``/etc`` files (:mod:`.inject`); its network policy; the
daemon, over its one-time token, gets the sandbox's env vars and access token (``/init``, which
replaces the one-time token). Only then is the pod ``bound`` and ``wait_ready`` returns it. Any
failure of the host-side steps gives the pod up and the workload starts cold.

A claim that never reached step 2 (its claimer died) is found by its age and the pod discarded.

A pool pod remembers the version of its template it was started from (``PodRecord.
template_version``): one of another version (image, env, limits, command, layers changed) is
never claimed, and the refill discards it and starts the slot again from the template as it is.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx
import structlog

from shared.errors import ConfigError, Conflict, NotFound, RuntimeFailure
from shared.models.network import OPEN
from shared.ports.workloads import ENVD_PORT, LABEL_MANAGED_BY, MANAGED_BY
from shared.runtime.local import etc, inject, pod_dirs, procfs
from shared.runtime.local.addresses import AddressPool
from shared.runtime.local.launcher import PodLauncher
from shared.runtime.local.layers import Persist
from shared.runtime.local.network import PodNetwork
from shared.runtime.local.network.names import pod_net_id
from shared.runtime.local.records import Claim, Pool, WorkloadRecord, WorkloadStore
from shared.runtime.local.userns import IdRangePool
from shared.runtime.templates import load_template, template_version

log = structlog.get_logger()

POOL_PREFIX = "pool-"
LABEL_POOL = "torpor.dev/pool"
# A claim that did not reach the workload within this long was abandoned by a dead claimer.
CLAIM_TIMEOUT = 30.0
_BIND_TIMEOUT = 10.0


def slot_name(template: str, slot: int) -> str:
    return f"{POOL_PREFIX}{hashlib.sha256(template.encode()).hexdigest()[:10]}-{slot}"


def is_pool_name(name: str) -> bool:
    return name.startswith(POOL_PREFIX)


class Pools:
    def __init__(
        self,
        *,
        sizes: Mapping[str, int],
        store: WorkloadStore,
        addresses: AddressPool,
        id_ranges: IdRangePool,
        launcher: PodLauncher,
        network: PodNetwork,
        template_dirs: list[Path],
        kick: Callable[[str], None],
        concurrency: int = 1,
        claim_timeout: float = CLAIM_TIMEOUT,
    ) -> None:
        self._sizes = dict(sizes)
        self._store = store
        self._addresses = addresses
        self._id_ranges = id_ranges
        self._launcher = launcher
        self._network = network
        self._template_dirs = template_dirs
        self._kick = kick
        self._concurrency = concurrency
        self._claim_timeout = claim_timeout
        self._me = secrets.token_hex(8)  # this runtime, as a binder of claimed pods
        self._http = httpx.AsyncClient(timeout=_BIND_TIMEOUT, trust_env=False)

    async def close(self) -> None:
        await self._http.aclose()

    # ---- refilling ---------------------------------------------------------------------

    async def refill(self, *, busy: Callable[[], bool]) -> None:
        """Fill empty slots, at most ``concurrency`` pool pods starting at once and none while
        this runtime starts a sandbox's pod (pools never delay real work); mark started pool
        pods ready once their daemon answers; remove slots beyond the configured sizes."""
        starting = 0
        wanted: list[tuple[str, str]] = []
        for template, size in self._sizes.items():
            version = await self._version(template)
            for slot in range(size):
                name = slot_name(template, slot)
                current = await self._store.get(name)
                if current is None:
                    if version is not None:
                        wanted.append((template, name))
                    continue
                record = current[0]
                if record.pool is None or record.pool.claimed_by or record.deleting:
                    continue
                if record.pool.template != template:
                    continue  # a slot name shared by two templates: that one's pool holds it
                if record.pod is not None and record.pod.template_version != version:
                    # Started from an older template (or one gone): it drains, its slot refills.
                    log.info("runtime_local_pool_stale", workload=name, template=template)
                    await self.discard(name)
                    continue
                if record.pod is None or not record.pod.ready:
                    starting += 1
                    if record.pod is not None and await self._healthy(record.address, 0.5):
                        await self._mark_ready(name, record.pod.uid)
        for template, name in wanted:
            if starting >= self._concurrency or busy():
                break
            await self._create(template, name)
            starting += 1
        await self._trim()

    async def _version(self, template: str) -> str | None:
        """The template's version now; None when it cannot be loaded (its pool drains)."""
        try:
            loaded = await asyncio.to_thread(load_template, template, self._template_dirs)
        except (NotFound, ConfigError) as e:
            log.warning("runtime_local_pool_template_unusable", template=template, error=str(e))
            return None
        return template_version(loaded)

    async def _create(self, template: str, name: str) -> None:
        address = await self._addresses.reserve(name)
        id_base = await self._id_ranges.reserve(name)
        record = WorkloadRecord(
            name=name,
            template=template,
            owner="",
            labels={LABEL_MANAGED_BY: MANAGED_BY, LABEL_POOL: "true"},
            annotations={},
            access_token=secrets.token_hex(24),  # the one-time token: only this runtime's
            replicas=1,
            address=address,
            id_base=id_base,
            pool=Pool(template=template),
        )
        if await self._store.create(record) is None:  # another runtime filled the slot
            await self._addresses.release(address)
            await self._id_ranges.release(id_base)
            return
        log.info("runtime_local_pool_filling", workload=name, template=template)
        self._kick(name)

    async def _trim(self) -> None:
        """Unclaimed pool pods of templates (or slots) no longer configured go."""
        wanted = {slot_name(t, i) for t, n in self._sizes.items() for i in range(n)}
        for name in await self._store.names():
            if not is_pool_name(name) or name in wanted:
                continue
            current = await self._store.get(name)
            if current is None or current[0].pool is None or current[0].pool.claimed_by:
                continue
            await self.discard(name)

    async def discard(self, name: str) -> None:
        """Delete pool workload ``name`` and its pod (the usual delete path)."""

        def change(r: WorkloadRecord) -> WorkloadRecord | None:
            if r.deleting:
                return None
            pod = [r.pod] if r.pod is not None else []
            return r.model_copy(
                update={
                    "deleting": True,
                    "replicas": 0,
                    "pod": None,
                    "terminating": [*r.terminating, *pod],
                }
            )

        try:
            await self._store.mutate(name, change)
        except NotFound:
            return
        self._kick(name)

    async def _healthy(self, address: str, patience: float) -> bool:
        try:
            response = await self._http.get(
                f"http://{address}:{ENVD_PORT}/health", timeout=patience
            )
        except httpx.HTTPError:
            return False
        return response.is_success

    async def _mark_ready(self, name: str, uid: str) -> None:
        def change(r: WorkloadRecord) -> WorkloadRecord | None:
            if r.pod is None or r.pod.uid != uid or r.pod.ready or r.pool is None:
                return None
            return r.model_copy(update={"pod": r.pod.model_copy(update={"ready": True})})

        try:
            await self._store.mutate(name, change)
        except NotFound:
            return
        log.info("runtime_local_pool_ready", workload=name, pod_uid=uid)

    # ---- claiming ----------------------------------------------------------------------

    def serves(self, template: str) -> bool:
        return self._sizes.get(template, 0) > 0

    async def claim(self, record: WorkloadRecord) -> bool:
        """Give ``record`` (which wants a pod) a warm pod of its template; False: none ready (or
        the workload cannot take one), start cold."""
        if (
            record.pool is not None
            or not self.serves(record.template)
            or record.access_token is None
            or record.id_base is None
        ):
            return False
        template = await asyncio.to_thread(load_template, record.template, self._template_dirs)
        fresh = template.persist == "none" or not self._launcher.layers.folder(record.name).exists()
        version = template_version(template)
        for slot in range(self._sizes[record.template]):
            name = slot_name(record.template, slot)
            outcome = await self._take(record, name, fresh=fresh, version=version)
            if outcome is not None:
                return outcome
        return False

    async def _take(
        self, record: WorkloadRecord, name: str, *, fresh: bool, version: str
    ) -> bool | None:
        """Claim pool pod ``name`` for ``record``: True when the workload has a pod now, False
        when it no longer wants one, None when this pool pod was not to be had (taken, not
        ready, or started from another version of the template than ``version``)."""
        current = await self._store.get(name)
        if current is None:
            return None
        pool_record, revision = current
        pod = pool_record.pod
        if (
            pool_record.pool is None
            or pool_record.pool.claimed_by is not None
            or pool_record.deleting
            or pool_record.template != record.template
            or pod is None
            or not pod.ready
            or pod.template_version != version
            or pool_record.access_token is None
            or pool_record.id_base is None
            or not procfs.is_pod_alive(pod.pid, pod.uid, pod.start_ticks)
        ):
            return None
        taken = pool_record.model_copy(
            update={
                "pool": pool_record.pool.model_copy(
                    update={"claimed_by": record.name, "claimed_at": time.time()}
                )
            }
        )
        try:
            await self._store.put(taken, last=revision)
        except Conflict:
            return None  # another claim took it: try the next
        claimed = pod.model_copy(
            update={
                "ready": False,
                "claim": Claim(
                    pool=name,
                    secret=pool_record.access_token,
                    old_address=record.address,
                    old_id_base=record.id_base,
                    fresh=fresh,
                    binder=self._me,
                    lease_until=time.time() + self._claim_timeout,
                ),
            }
        )
        address, id_base = pool_record.address, pool_record.id_base

        def change(r: WorkloadRecord) -> WorkloadRecord | None:
            if r.pod is not None or r.replicas != 1 or r.deleting:
                return None
            return r.model_copy(update={"pod": claimed, "address": address, "id_base": id_base})

        try:
            current_record: WorkloadRecord | None = (await self._store.mutate(record.name, change))[
                0
            ]
        except NotFound:
            current_record = None
        if current_record is None or current_record.pod != claimed:
            await self.discard(name)  # claimed for nothing: it goes, unused
            return current_record is not None and current_record.pod is not None
        log.info("runtime_local_pool_claimed", workload=record.name, pool=name, pod_uid=pod.uid)
        return True

    async def finish(self, record: WorkloadRecord, revision: int) -> float | None:
        """Bind the claimed, not yet bound pod of ``record`` to it (see the module docstring):
        by the runtime that claimed it, or by another once that one's lease ran out. ``None``
        when it acted (look at the record again), else the seconds to wait for the lease."""
        pod = record.pod
        assert pod is not None
        assert pod.claim is not None
        assert record.id_base is not None
        name = record.name
        if pod.claim.binder != self._me:
            wait = pod.claim.lease_until - time.time()
            if wait > 0:
                return wait  # the claimer binds it
            taken = pod.claim.model_copy(
                update={"binder": self._me, "lease_until": time.time() + self._claim_timeout}
            )
            try:
                await self._store.put(
                    record.model_copy(update={"pod": pod.model_copy(update={"claim": taken})}),
                    last=revision,
                )
            except Conflict:
                return None
            pod = pod.model_copy(update={"claim": taken})
        claim = pod.claim
        assert claim is not None
        address, id_base = record.address, record.id_base

        async def move_address() -> None:
            await self._addresses.transfer(address, name)
            if claim.old_address is not None and claim.old_address != address:
                await self._addresses.release_held(claim.old_address, name)

        async def move_ids() -> None:
            await self._id_ranges.transfer(id_base, name)
            if claim.old_id_base is not None and claim.old_id_base != id_base:
                await self._id_ranges.release_held(claim.old_id_base, name)

        # Separate keys, each step repeatable: the two reservations move side by side.
        await asyncio.gather(move_address(), move_ids())
        spans: dict[str, float] = {}
        last = started = time.monotonic()

        def mark(phase: str) -> None:
            nonlocal last
            now = time.monotonic()
            spans[f"{phase}_ms"] = round((now - last) * 1000, 1)
            last = now

        try:
            # One hop to a worker thread for all host-side steps: under load each hop waits.
            await asyncio.to_thread(self._bind_host, record, mark)
            if record.network != OPEN:  # what the pool pod started with
                await self._network.apply_policy(
                    pod_net_id(pod.uid), record.address, record.network
                )
            mark("network")
            await self._bind_daemon(record, claim)
            mark("daemon")
        except (RuntimeFailure, OSError, httpx.HTTPError, NotFound) as e:
            # repr: some httpx errors have no message; the address says which daemon it dialled
            log.warning(
                "runtime_local_pool_claim_failed",
                workload=name,
                pod_uid=pod.uid,
                address=record.address,
                error=repr(e)[:300],
            )
            await self._give_up(record)
            return None

        def bound(r: WorkloadRecord) -> WorkloadRecord | None:
            if r.pod is None or r.pod.uid != pod.uid or r.pod.claim is None:
                return None
            done = r.pod.claim.model_copy(update={"bound": True})
            new_pod = r.pod.model_copy(update={"claim": done, "ready": True})
            return r.model_copy(update={"pod": new_pod})

        await self._store.mutate(name, bound)
        await self._forget_pool(claim.pool, name)
        log.info(
            "runtime_local_pool_bound",
            workload=name,
            pod_uid=pod.uid,
            bind_ms=round((time.monotonic() - started) * 1000, 1),
            **spans,
        )
        return None

    def _bind_host(self, record: WorkloadRecord, mark: Callable[[str], None]) -> None:
        """The host-side binding steps (blocking: run in a worker thread)."""
        pod = record.pod
        assert pod is not None
        assert pod.claim is not None
        assert record.id_base is not None
        claim, base = pod.claim, record.id_base
        template = load_template(record.template, self._template_dirs)
        inner = procfs.inner_pid(pod.pid)
        if inner is None:
            raise RuntimeFailure(f"the warm pod {pod.uid} is gone")
        self._launcher.claimed(pod.uid)
        mark("find")
        layers = self._launcher.layers
        held = self._launcher.held_layer(pod.uid)
        persist = Persist(template.persist)
        if held != record.name:
            if not claim.fresh:
                if claim.old_id_base is None:
                    raise RuntimeFailure(f"{record.name} has kept files but no id range")
                self._launcher.switch_layer(
                    pod.uid,
                    inner,
                    pool=claim.pool,
                    name=record.name,
                    old_base=claim.old_id_base,
                    new_base=base,
                    disk_bytes=template.resources.limits.disk_bytes,
                )
            else:
                layers.hand_over(claim.pool, record.name)
                self._launcher.note_layer(pod.uid, record.name, persist)
        mark("layer")
        volumes = self._launcher.volumes(template, record, base)
        binds = [
            inject.Bind(
                source=v.source,
                target=v.target,
                owner=base,
                read_only=v.read_only,
                identity=v.identity,
            )
            for v in volumes
        ]
        inject.apply(inner, binds, hostname=record.name)
        mark("mounts")
        pod_dir = self._launcher.pod_dir(pod.uid)
        assert pod_dir is not None
        etc.write_etc(
            pod_dirs.files_dir(pod_dir) / "etc",
            hostname=record.name,
            address=record.address,
            accounts=False,
        )

    async def _bind_daemon(self, record: WorkloadRecord, claim: Claim) -> None:
        """The sandbox's env vars and token, through the pool daemon's one-time token (which the
        new token replaces: a repeat finds the sandbox's own token working instead)."""
        url = f"http://{record.address}:{ENVD_PORT}"
        body = {
            "envVars": {**record.envs, "E2B_SANDBOX_ID": record.name},
            "accessToken": record.access_token,
        }
        response = await self._http.post(
            f"{url}/init", json=body, headers={"X-Access-Token": claim.secret}
        )
        if response.status_code == 401 and record.access_token:
            response = await self._http.post(
                f"{url}/init", json=body, headers={"X-Access-Token": record.access_token}
            )
        if not response.is_success:
            msg = f"the daemon of warm pod {record.pod.uid if record.pod else '?'} at "
            msg += f"{record.address} refused binding ({response.status_code})"
            raise RuntimeFailure(msg)

    async def _give_up(self, record: WorkloadRecord) -> None:
        """The claimed pod cannot serve the sandbox: it goes, and the workload starts cold."""
        pod = record.pod
        assert pod is not None
        assert pod.claim is not None

        def change(r: WorkloadRecord) -> WorkloadRecord | None:
            if r.pod is None or r.pod.uid != pod.uid:
                return None
            return r.model_copy(update={"pod": None, "terminating": [*r.terminating, r.pod]})

        await self._store.mutate(record.name, change)
        await self._forget_pool(pod.claim.pool, record.name)

    async def _forget_pool(self, pool: str, claimer: str) -> None:
        """Remove the claimed pool record: its pod, address and ids are the claimer's now."""
        while True:
            current = await self._store.get(pool)
            if current is None:
                return
            record, revision = current
            if record.pool is None or record.pool.claimed_by != claimer:
                return
            try:
                await self._store.remove(pool, last=revision)
                return
            except Conflict:
                continue

    async def claimed_step(self, record: WorkloadRecord) -> None:
        """A claimed pool record still here: finish the claim if the workload holds the pod,
        else (after ``CLAIM_TIMEOUT``: its claimer died before step 2) discard the pod."""
        assert record.pool is not None
        assert record.pool.claimed_by is not None
        claimer = record.pool.claimed_by
        pod_uid = record.pod.uid if record.pod is not None else None
        current = await self._store.get(claimer)
        held = current[0].pod if current is not None else None
        if held is not None and held.uid == pod_uid:
            if held.claim is not None and held.claim.bound:
                await self._forget_pool(record.name, claimer)  # finished but for this
            else:
                self._kick(claimer)
            return
        if time.time() - record.pool.claimed_at < self._claim_timeout:
            return
        log.warning("runtime_local_pool_claim_abandoned", workload=record.name, claimer=claimer)
        await self.discard(record.name)
