"""The local runtime: ReplicaSet-shaped workloads as bubblewrap-isolated process trees.

This module is the :class:`shared.ports.runtime.Runtime` port: records in NATS KV
(``torpor_workloads``, see :mod:`.records`), changed by CAS, and a :mod:`.reconciler` that makes
the processes match them. Each workload has one address (:mod:`.addresses`) reserved for its
lifetime. Its pod (:mod:`.launcher`, :mod:`.bwrap`) is the in-sandbox daemon
(``python -m services.envd``) under ``bwrap`` with its own user/PID/IPC/UTS/mount namespaces and
its own network namespace (:mod:`.network`: it listens on its pod address, port 49983, and
reaches only the outside, through NAT, as its NetworkPolicy allows), a read-only view of the OS
and of the daemon's code, a fresh ``/workspace`` that is deleted when the pod stops, and the
template's volumes (host
directories kept across pauses). "Ready" means the daemon's ``/health`` answers 2xx.

Pods do not depend on the runtime that started them: after a ``kill -9`` of the owner the next
``LocalRuntime`` adopts the running pods (found by pid and pod uid, :mod:`.procfs`) and stops
strays (pods without a record); ``close()`` stops every pod of its data dir
(``stop_pods_on_close``) while keeping ``replicas``, so the next start brings them back.

Isolation is not a VM's (see docs/security.md, "Local runtime: users, filesystem, limits" and
"Local runtime: network"): pods share the host's kernel. Each pod's root is root of its own user
namespace only, mapped to an unprivileged host id range (:mod:`.userns`), with no capabilities;
it sees a read-only OS, its own ``/etc`` (:mod:`.etc`) and torpor's daemon code, never other
pods' files or processes, and reaches neither the host, its loopback services (NATS, the API)
nor other pods over the network. Limits: :mod:`.limits` (cgroups) and :mod:`.disk` (workspace
size).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import nats
import structlog
from nats.aio.client import Client
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

from shared.bus.topology import KV_WORKLOADS, workloads_bucket
from shared.errors import (
    Conflict,
    NotFound,
    PodNotReady,
    ReadyFailed,
    RuntimeFailure,
    Unavailable,
)
from shared.models.network import NetworkPolicy
from shared.models.template_records import BUILT_TEMPLATES_DIR
from shared.ports.workloads import (
    ENVD_PORT,
    LABEL_MANAGED_BY,
    LABEL_OWNER,
    LABEL_SANDBOX_ID,
    MANAGED_BY,
    Endpoint,
    Workload,
    WorkloadSpec,
)
from shared.redaction import redact_text
from shared.runtime.local import bwrap, bytecode, limits, mounts, snapshot_files
from shared.runtime.local import rootfs as rootfs_location
from shared.runtime.local.addresses import AddressPool
from shared.runtime.local.launcher import STAGE_DIR, PodLauncher
from shared.runtime.local.layers import Layers
from shared.runtime.local.network import PodNetwork
from shared.runtime.local.pools import is_pool_name
from shared.runtime.local.reconciler import Reconciler
from shared.runtime.local.records import WorkloadRecord, WorkloadStore
from shared.runtime.local.userns import IdRangePool
from shared.runtime.readiness import not_ready_reason
from shared.runtime.templates import Template, load_template, template_dirs

log = structlog.get_logger()

DEFAULT_BUCKET = KV_WORKLOADS
# Kubernetes' limit for all annotations of one object; the local runtime enforces the same.
MAX_ANNOTATIONS_BYTES = 256 * 1024
_NAME_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


class LocalRuntime:
    """The embedded default implementation of :class:`shared.ports.runtime.Runtime`."""

    def __init__(
        self,
        *,
        nats_url: str,
        data_dir: Path,
        nats_options: Mapping[str, Any] | None = None,
        templates_dir: Path | None = None,
        bucket: str = DEFAULT_BUCKET,
        bwrap: str = "bwrap",
        python: str = sys.executable,
        stop_grace: float = 2.0,
        supervise: bool = True,
        stop_pods_on_close: bool = True,
        pod_cidr: str = "auto",
        poll_interval: float = 1.0,
        rootfs: Path | None = None,
        pools: Mapping[str, int] | None = None,
        pool_claim_timeout: float = 30.0,
    ) -> None:
        self._nats_url = nats_url
        self._nats_options = dict(nats_options or {})  # credentials, inbox prefix
        self._data_dir = data_dir.resolve()
        self._template_dirs = template_dirs(
            templates_dir, built=self._data_dir / BUILT_TEMPLATES_DIR
        )
        self._bucket = bucket
        self._bwrap = bwrap
        self._python = python
        self._stop_grace = stop_grace
        self._supervise = supervise
        self._stop_pods_on_close = stop_pods_on_close
        self._network = PodNetwork(self._data_dir, pod_cidr=pod_cidr)  # ConfigError if bad
        self._poll_interval = poll_interval
        self._rootfs = rootfs
        # Warm pods per template (see .pools), kept by a supervising runtime.
        self._pools = {t: n for t, n in (pools or {}).items() if n > 0} if supervise else {}
        self._pool_claim_timeout = pool_claim_timeout
        self._nc: Client | None = None
        self._store_: WorkloadStore | None = None
        self._addresses_: AddressPool | None = None
        self._id_ranges_: IdRangePool | None = None
        self._reconciler_: Reconciler | None = None
        self._launcher: PodLauncher | None = None
        self._closing = False

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self) -> LocalRuntime:
        await bwrap.check_bwrap(self._bwrap)
        rootfs = await asyncio.to_thread(rootfs_location.locate, self._rootfs)
        await self._network.open()
        (self._data_dir / "pods").mkdir(parents=True, exist_ok=True)
        (self._data_dir / "logs").mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(STAGE_DIR.mkdir, mode=0o755, exist_ok=True)
        cgroups = await asyncio.to_thread(
            limits.Cgroups.detect, limits.instance_name(self._data_dir)
        )
        pycache = await asyncio.to_thread(bytecode.cache_dir, self._data_dir)
        await bytecode.ensure(self._python, pycache)
        self._launcher = PodLauncher(
            data_dir=self._data_dir,
            template_dirs=self._template_dirs,
            bwrap_path=self._bwrap,
            python=self._python,
            stop_grace=self._stop_grace,
            pycache=pycache,
            cgroups=cgroups,
            rootfs=rootfs,
        )
        try:
            self._nc = await nats.connect(
                self._nats_url, max_reconnect_attempts=-1, **self._nats_options
            )
        except Exception as e:  # nats-py raises several unrelated types on connect failure
            msg = f"cannot connect to NATS at {redact_text(self._nats_url)}: {e}"
            raise Unavailable(msg) from e
        kv = await self._bucket_kv()
        self._store_ = WorkloadStore(kv)
        self._addresses_ = AddressPool(kv, network=self._network)
        self._id_ranges_ = IdRangePool(kv, instance=str(self._data_dir))
        self._reconciler_ = Reconciler(
            store=self._store_,
            addresses=self._addresses_,
            id_ranges=self._id_ranges_,
            launcher=self._launcher,
            network=self._network,
            poll_interval=self._poll_interval,
            pools=self._pools,
            template_dirs=self._template_dirs,
            pool_claim_timeout=self._pool_claim_timeout,
        )
        if self._supervise:
            await self._reconciler_.reconcile_all(stray_sweep=True)
            self._reconciler_.start_monitor()
        log.info("runtime_local_started", data_dir=str(self._data_dir), cgroups=bool(cgroups))
        return self

    async def __aenter__(self) -> LocalRuntime:
        return await self.start()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._reconciler_ is None:
            if self._nc is not None:
                await self._nc.close()
            return
        await self._reconciler_.close()
        try:
            if self._stop_pods_on_close:
                await self._reconciler_.stop_everything()
        finally:
            if self._stop_pods_on_close:  # even when NATS is gone: never leave orphans
                await self._reconciler_.stop_strays(set())
                await self._network.release()
                if self._launcher is not None:
                    await self._launcher.close()
            if self._nc is not None:
                await self._nc.close()

    async def _bucket_kv(self) -> KeyValue:
        assert self._nc is not None
        js = self._nc.jetstream()
        try:
            return await js.key_value(self._bucket)
        except BucketNotFoundError:
            return await js.create_key_value(replace(workloads_bucket(), bucket=self._bucket))

    @property
    def _store(self) -> WorkloadStore:
        if self._store_ is None:
            msg = "LocalRuntime used before start()"
            raise RuntimeFailure(msg)
        return self._store_

    @property
    def _addresses(self) -> AddressPool:
        if self._addresses_ is None:
            msg = "LocalRuntime used before start()"
            raise RuntimeFailure(msg)
        return self._addresses_

    @property
    def _reconciler(self) -> Reconciler:
        if self._reconciler_ is None:
            msg = "LocalRuntime used before start()"
            raise RuntimeFailure(msg)
        return self._reconciler_

    # ---- the port ----------------------------------------------------------------------

    async def create(self, spec: WorkloadSpec) -> Workload:
        # The name becomes a KV key, a hostname, a log file name and a bwrap argument: a DNS
        # label (as Kubernetes requires too), checked before anything else.
        if not _NAME_RE.fullmatch(spec.name) or is_pool_name(spec.name):
            msg = f"invalid workload name {spec.name[:80]!r}: must be a DNS label, not pool-*"
            raise RuntimeFailure(msg)
        # An unknown template is NotFound now, not a pod that never starts.
        await asyncio.to_thread(load_template, spec.template, self._template_dirs)
        existing = await self._store.get(spec.name)
        if existing is not None:
            return self._view(*existing)
        labels = {
            **spec.labels,
            LABEL_SANDBOX_ID: spec.name,
            LABEL_OWNER: spec.owner,
            LABEL_MANAGED_BY: MANAGED_BY,
        }
        _check_annotations(spec.annotations)
        bwrap.check_env(spec.envs)
        address = await self._addresses.reserve(spec.name)
        assert self._id_ranges_ is not None
        id_base = await self._id_ranges_.reserve(spec.name)
        record = WorkloadRecord(
            name=spec.name,
            template=spec.template,
            owner=spec.owner,
            labels=labels,
            annotations=dict(spec.annotations),
            envs=dict(spec.envs),
            access_token=spec.access_token,
            network=spec.network,
            replicas=spec.replicas,
            address=address,
            id_base=id_base,
        )
        revision = await self._store.create(record)
        if revision is None:  # lost a create race: the other one stands
            await self._addresses.release(address)
            await self._id_ranges_.release(id_base)
            current = await self._store.get(spec.name)
            if current is None:
                msg = f"workload {spec.name} vanished while being created"
                raise Conflict(msg)
            return self._view(*current)
        log.info("runtime_local_created", workload=spec.name, address=address)
        self._reconciler.kick(spec.name)
        return self._view(record, revision)

    async def get(self, name: str) -> Workload | None:
        current = await self._store.get(name)
        return None if current is None or current[0].deleting else self._view(*current)

    async def patch_annotations(
        self,
        name: str,
        annotations: Mapping[str, str | None],
        *,
        resource_version: str | None = None,
    ) -> Workload:
        def change(record: WorkloadRecord) -> WorkloadRecord:
            merged = dict(record.annotations)
            for key, value in annotations.items():
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
            _check_annotations(merged)
            return record.model_copy(update={"annotations": merged})

        if resource_version is None:
            return self._view(*await self._store.mutate(name, change))
        current = await self._store.get(name)
        if current is None or current[0].deleting:
            msg = f"workload {name} not found"
            raise NotFound(msg)
        record, revision = current
        if str(revision) != resource_version:
            msg = f"workload {name} is at version {revision}, not {resource_version}"
            raise Conflict(msg)
        new = change(record)
        return self._view(new, await self._store.put(new, last=revision))

    async def scale(self, name: str, replicas: int) -> Workload:
        if replicas not in (0, 1):
            msg = f"replicas must be 0 or 1, not {replicas}"
            raise RuntimeFailure(msg)

        def change(record: WorkloadRecord) -> WorkloadRecord | None:
            if record.deleting:
                msg = f"workload {name} is being deleted"
                raise NotFound(msg)
            if replicas == 0 and record.pod is not None:
                # The pod leaves the record now, so wait_ready never returns it again.
                return record.model_copy(
                    update={
                        "replicas": 0,
                        "pod": None,
                        "terminating": [*record.terminating, record.pod],
                    }
                )
            if replicas == record.replicas:
                return None
            return record.model_copy(
                update={"replicas": replicas, "restarts": 0, "not_before": 0.0}
            )

        record, revision = await self._store.mutate(name, change)
        self._reconciler.kick(name)
        return self._view(record, revision)

    async def set_network(self, name: str, policy: NetworkPolicy) -> None:
        def change(record: WorkloadRecord) -> WorkloadRecord | None:
            if record.deleting:
                msg = f"workload {name} is being deleted"
                raise NotFound(msg)
            if record.network == policy:
                return None
            return record.model_copy(update={"network": policy})

        await self._store.mutate(name, change)
        await self._reconciler.apply_network(name)  # a running pod gets it at once

    async def wait_ready(self, name: str, *, timeout: float) -> Endpoint:
        deadline = time.monotonic() + timeout
        waiting: str | None = None  # the daemon's last "ready command not yet" (startup.py)
        async with httpx.AsyncClient(timeout=1.0, trust_env=False) as client:
            while True:
                changed = self._store.changed(name)
                current = await self._store.get(name)
                if current is None or current[0].deleting:
                    msg = f"workload {name} not found"
                    raise NotFound(msg)
                record, _ = current
                pod = record.pod
                if pod is not None and pod.claim is not None:
                    # A warm pod: ready once bound to this workload (see .pools).
                    if pod.claim.bound and pod.ready:
                        return Endpoint(
                            host=record.address, port=ENVD_PORT, pod_uid=pod.uid, warm=True
                        )
                    pod = None
                # The daemon binds before importing its app: one patient probe is the fastest.
                patience = max(0.05, min(deadline - time.monotonic(), 5.0))
                healthy = False
                if pod is not None:
                    healthy, waiting = await self._probe(client, record.address, patience)
                if pod is not None and healthy:
                    if pod.ready or await self._mark_ready(name, pod.uid):
                        return Endpoint(host=record.address, port=ENVD_PORT, pod_uid=pod.uid)
                    continue  # replaced or stopped meanwhile: look again
                if time.monotonic() >= deadline and waiting is not None:
                    # Up, but its ready command kept failing: waiting longer will not heal it.
                    msg = f"pod of {name} not ready within {timeout:g}s: {waiting}"
                    raise ReadyFailed(msg)
                if time.monotonic() >= deadline:
                    msg = f"pod of {name} not ready within {timeout:g}s{self._log_tail(record)}"
                    raise PodNotReady(msg)
                # This process's reconciler (which binds a warm pod) wakes it at once.
                await _until(changed, 0.02)

    async def wait_stopped(self, name: str, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            changed = self._store.changed(name)
            current = await self._store.get(name)
            if current is None:
                return
            record, _ = current
            if record.pod is None and not record.terminating:
                return
            if time.monotonic() >= deadline:
                msg = f"pod of {name} still running after {timeout:g}s"
                raise RuntimeFailure(msg)
            await _until(changed, 0.02)

    async def delete(self, name: str) -> None:
        def change(record: WorkloadRecord) -> WorkloadRecord:
            pod = [record.pod] if record.pod is not None else []
            return record.model_copy(
                update={
                    "deleting": True,
                    "replicas": 0,
                    "pod": None,
                    "terminating": [*record.terminating, *pod],
                }
            )

        try:
            await self._store.mutate(name, change)
        except NotFound:
            return
        await self._reconciler.reconcile(name)

    async def list(self, *, labels: Mapping[str, str] | None = None) -> list[Workload]:
        out = []
        for name in await self._store.names():
            current = await self._store.get(name)
            if current is None or current[0].deleting:
                continue
            record, revision = current
            if record.pool is not None:  # a warm pod waiting for a sandbox: nobody's workload
                continue
            if labels and any(record.labels.get(k) != v for k, v in labels.items()):
                continue
            out.append(self._view(record, revision))
        return out

    async def templates_in_use(self) -> set[str]:
        """The template of every workload record (paused, warm in a pool or being deleted
        included): their pods mount its layers, so the builder's garbage collection keeps them."""
        out: set[str] = set()
        for name in await self._store.names():
            current = await self._store.get(name)
            if current is not None:
                out.add(current[0].template)
        return out

    async def warm_pods(self, template: str) -> int:
        """Pods of ``template``'s pool ready to be claimed now (tests, benchmarks, status)."""
        count = 0
        for name in await self._store.names():
            current = await self._store.get(name) if is_pool_name(name) else None
            if current is None:
                continue
            record = current[0]
            if (
                record.pool is not None
                and record.template == template
                and record.pool.claimed_by is None
                and not record.deleting
                and record.pod is not None
                and record.pod.ready
            ):
                count += 1
        return count

    # ---- kept files (the snapshot code's port; see .layers) ------------------------------

    async def export_files(self, name: str, dest: Path) -> None:
        """Copy the kept files of paused workload ``name`` into ``dest`` (a new folder), with
        the sandbox's own ids. ``Conflict`` while a pod runs."""
        record, layers, disk_bytes = await self._stopped(name)
        assert record.id_base is not None
        await asyncio.to_thread(
            layers.export, name, dest, base=record.id_base, disk_bytes=disk_bytes
        )

    async def import_files(self, name: str, source: Path) -> None:
        """Start workload ``name`` (created with ``replicas=0``, never run) from files of
        :meth:`export_files`; scale it to 1 afterwards."""
        record, layers, disk_bytes = await self._stopped(name)
        assert record.id_base is not None
        await asyncio.to_thread(
            layers.restore, name, source, base=record.id_base, disk_bytes=disk_bytes
        )

    async def _stopped(self, name: str) -> tuple[WorkloadRecord, Layers, int | None]:
        current = await self._store.get(name)
        if current is None or current[0].deleting:
            msg = f"workload {name} not found"
            raise NotFound(msg)
        record = current[0]
        if (
            record.pod is not None
            or record.terminating
            or record.replicas
            or self._launcher is None
        ):
            msg = f"workload {name} has a pod: its files can be copied only while it is stopped"
            raise Conflict(msg)
        if record.id_base is None:
            msg = f"workload {name} has no id range yet"
            raise Conflict(msg)
        template = await asyncio.to_thread(load_template, record.template, self._template_dirs)
        if template.persist != "layer":
            msg = f"workload {name} keeps no files (template {record.template}: persist none)"
            raise Conflict(msg)
        return record, self._launcher.layers, template.resources.limits.disk_bytes

    # ---- files of stored snapshots (see .snapshot_files) ---------------------------------

    async def _snapshot_parts(
        self, name: str
    ) -> tuple[WorkloadRecord, Layers, Template, dict[str, Path]]:
        """The workload, its layers, template and own writable volumes (``volume-<name>``)."""
        current = await self._store.get(name)
        if current is None or current[0].deleting:
            raise NotFound(f"workload {name} not found")
        record = current[0]
        if record.id_base is None or self._launcher is None:
            raise Conflict(f"workload {name} has no id range yet")
        template = await asyncio.to_thread(load_template, record.template, self._template_dirs)
        volumes = {
            f"volume-{v.name}": v.resolve(self._data_dir, sandbox_id=name, owner=record.owner)
            for v in template.volumes
            if not v.read_only and "{sandbox_id}" in v.host_path
        }
        return record, self._launcher.layers, template, volumes

    async def save_files(self, name: str, snapshot_id: str) -> int:
        record, layers, template, volumes = await self._snapshot_parts(name)
        assert record.id_base is not None
        disk_bytes = template.resources.limits.disk_bytes
        in_use = await asyncio.to_thread(mounts.is_mounted, layers.folder(name) / "mnt")
        # A running pod's layer (either persist mode) or a paused sandbox's kept one; a paused
        # `persist: none` sandbox has no files to keep.
        layer = (
            layers.mounted(name, base=record.id_base, disk_bytes=disk_bytes)
            if in_use or template.persist == "layer"
            else None
        )
        return await asyncio.to_thread(
            snapshot_files.save,
            self._data_dir,
            snapshot_id,
            layer=layer,
            volumes=volumes,
            id_base=record.id_base,
        )

    async def restore_files(self, snapshot_id: str, name: str) -> None:
        record, layers, template, volumes = await self._snapshot_parts(name)
        assert record.id_base is not None
        if record.pod is not None or record.terminating or record.replicas:
            raise Conflict(f"workload {name} has run: files are restored before its first pod")
        await asyncio.to_thread(
            snapshot_files.restore,
            self._data_dir,
            snapshot_id,
            layers=layers,
            name=name,
            id_base=record.id_base,
            disk_bytes=template.resources.limits.disk_bytes,
            volumes=volumes,
        )

    async def delete_snapshot_files(self, snapshot_id: str) -> None:
        await asyncio.to_thread(snapshot_files.delete, self._data_dir, snapshot_id)

    async def keep_files(self, name: str) -> int:
        del name  # a pod's layer outlives it (persist: layer), or nothing is kept (none)
        return 0

    # ---- views and helpers -----------------------------------------------------------

    def _view(self, record: WorkloadRecord, revision: int) -> Workload:
        pod = record.pod
        return Workload(
            name=record.name,
            template=record.template,
            labels=record.labels,
            annotations=record.annotations,
            replicas=record.replicas,
            ready_replicas=1 if pod is not None and pod.ready else 0,
            resource_version=str(revision),
            pod_uid=pod.uid if pod is not None else None,
            pod_ip=record.address if pod is not None else None,
        )

    async def _probe(
        self, client: httpx.AsyncClient, address: str, patience: float
    ) -> tuple[bool, str | None]:
        """(healthy, why not ready): the second is the daemon's reason while it waits for a
        template's ready command (503 ``not_ready``), None when it is down or answers else."""
        try:
            response = await client.get(f"http://{address}:{ENVD_PORT}/health", timeout=patience)
        except httpx.HTTPError:
            return False, None
        if response.is_success:
            return True, None
        return False, not_ready_reason(response.status_code, response.content)

    async def _mark_ready(self, name: str, uid: str) -> bool:
        """Record that pod ``uid`` answered; False when it is no longer the workload's pod."""

        def change(record: WorkloadRecord) -> WorkloadRecord | None:
            if record.pod is None or record.pod.uid != uid or record.pod.ready:
                return None
            return record.model_copy(update={"pod": record.pod.model_copy(update={"ready": True})})

        try:
            record, _ = await self._store.mutate(name, change)
        except NotFound:
            return False
        return record.pod is not None and record.pod.uid == uid and not record.deleting

    def _log_tail(self, record: WorkloadRecord) -> str:
        candidates = [Path(record.pod.pod_dir) / "pod.log"] if record.pod else []
        candidates.append(self._data_dir / "logs" / f"{record.name}.last.log")
        for path in candidates:
            with contextlib.suppress(OSError):
                lines = path.read_text(errors="replace").strip().splitlines()
                if lines:
                    return f" (pod log: {lines[-1][:300]})"
        return ""


def _check_annotations(annotations: Mapping[str, str]) -> None:
    size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    if size > MAX_ANNOTATIONS_BYTES:
        msg = f"annotations total {size} bytes, over the {MAX_ANNOTATIONS_BYTES}-byte limit"
        raise RuntimeFailure(msg)


async def _until(event: asyncio.Event, timeout: float) -> None:
    """Wait for ``event`` at most ``timeout`` seconds (a write of another process is not
    signalled: the caller looks again after the timeout)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)
