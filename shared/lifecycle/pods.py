"""From a sandbox record to what the runtime and the daemon need: workload spec, endpoint."""

from __future__ import annotations

from shared.domain.record import SandboxRecord
from shared.ports.runtime import Runtime
from shared.ports.workloads import (
    ANNOTATION_SNAPSHOT,
    LABEL_MANAGED_BY,
    LABEL_OWNER,
    LABEL_SANDBOX_ID,
    MANAGED_BY,
    Endpoint,
    Workload,
    WorkloadSpec,
)


def workload_spec(record: SandboxRecord, *, replicas: int = 1) -> WorkloadSpec:
    annotations = {}
    if record.snapshot is not None:
        # Re-creating a lost workload keeps the last snapshot in its annotation.
        annotations[ANNOTATION_SNAPSHOT] = record.snapshot.annotation
    elif record.origin is not None:
        # Started from a stored snapshot: its processes are the ones to replay.
        annotations[ANNOTATION_SNAPSHOT] = record.origin.annotation
    return WorkloadSpec(
        name=record.sandbox_id,
        template=record.template,
        owner=record.owner,
        labels={
            LABEL_SANDBOX_ID: record.sandbox_id,
            LABEL_OWNER: record.owner,
            LABEL_MANAGED_BY: MANAGED_BY,
        },
        annotations=annotations,
        envs=dict(record.envs),
        access_token=record.envd_access_token,
        network=record.network,
        replicas=1 if replicas else 0,
    )


async def ensure_workload(runtime: Runtime, record: SandboxRecord) -> Workload:
    found = await runtime.get(record.sandbox_id)
    if found is not None:
        return found
    return await runtime.create(workload_spec(record, replicas=0))


async def current_endpoint(runtime: Runtime, record: SandboxRecord) -> Endpoint | None:
    """The daemon of the workload's current pod (fresh from the runtime), else the record's."""
    workload = await runtime.get(record.sandbox_id)
    if workload is not None and workload.pod_ip and workload.pod_uid:
        return Endpoint(host=workload.pod_ip, pod_uid=workload.pod_uid)
    if record.host and record.pod_uid:
        return Endpoint(host=record.host, pod_uid=record.pod_uid)
    return None
