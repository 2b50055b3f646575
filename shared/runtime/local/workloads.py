"""The local runtime: ReplicaSet-shaped workloads as bubblewrap-isolated process trees.

This module is the :class:`shared.ports.runtime.Runtime` port's workload operations (its start
and close: :mod:`.instance`; waiting: :mod:`.waiting`; files: :mod:`.file_keeping`): records in
NATS KV (``torpor_workloads``, see :mod:`.records`), changed by CAS, and a :mod:`.reconciler`
that makes the processes match them. Each workload has one address (:mod:`.addresses`) reserved
for its lifetime. Its pod (:mod:`.launcher`, :mod:`.bwrap`) is the in-sandbox daemon
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
from collections.abc import Mapping

import structlog

from shared.errors import Conflict, NotFound, RuntimeFailure
from shared.models.network import NetworkPolicy
from shared.ports.workloads import (
    LABEL_MANAGED_BY,
    LABEL_OWNER,
    LABEL_SANDBOX_ID,
    MANAGED_BY,
    Workload,
    WorkloadSpec,
)
from shared.runtime.local import bwrap
from shared.runtime.local.file_keeping import FileKeeping
from shared.runtime.local.layers import is_workload_name
from shared.runtime.local.pools import is_pool_name
from shared.runtime.local.records import WorkloadRecord
from shared.runtime.local.waiting import Waiting
from shared.runtime.templates import load_template

log = structlog.get_logger()

# Kubernetes' limit for all annotations of one object; the local runtime enforces the same.
MAX_ANNOTATIONS_BYTES = 256 * 1024


class LocalRuntime(Waiting, FileKeeping):
    """The embedded default implementation of :class:`shared.ports.runtime.Runtime`."""

    # ---- the port ----------------------------------------------------------------------

    async def create(self, spec: WorkloadSpec) -> Workload:
        # The name becomes a KV key, a hostname, a log file name and a bwrap argument: a DNS
        # label (as Kubernetes requires too), checked before anything else.
        if not is_workload_name(spec.name) or is_pool_name(spec.name):
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

    async def scale(self, name: str, replicas: int) -> None:
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

        await self._store.mutate(name, change)
        self._reconciler.kick(name)

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


def _check_annotations(annotations: Mapping[str, str]) -> None:
    size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    if size > MAX_ANNOTATIONS_BYTES:
        msg = f"annotations total {size} bytes, over the {MAX_ANNOTATIONS_BYTES}-byte limit"
        raise RuntimeFailure(msg)
