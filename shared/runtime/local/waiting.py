"""Waiting for a workload's pod: until it is ready (its daemon's ``/health`` answers 2xx, or a
warm pod is bound to it) or until it is stopped."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import httpx

from shared.errors import NotFound, PodNotReady, ReadyFailed, RuntimeFailure
from shared.ports.workloads import ENVD_PORT, Endpoint
from shared.runtime.local import podlog
from shared.runtime.local.instance import RuntimeInstance
from shared.runtime.local.records import PodRecord, WorkloadRecord
from shared.runtime.readiness import not_ready_reason


class Waiting(RuntimeInstance):
    async def wait_ready(self, name: str, *, timeout: float, answering: bool = False) -> Endpoint:
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
                        return _endpoint(record.address, pod)
                    continue  # replaced or stopped meanwhile: look again
                if pod is not None and answering and waiting is not None:
                    # Up, waiting for its ready command: not marked ready (it is not yet).
                    return _endpoint(record.address, pod)
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
        """The last line of the pod's output (or of the dead pod's kept log), read by tail."""
        lines = [podlog.last_line(Path(record.pod.pod_dir))] if record.pod else []
        lines.append(podlog.last_line(self._data_dir / "logs", name=f"{record.name}.last.log"))
        line = next((ln for ln in lines if ln), "")
        return f" (pod log: {line[:300]})" if line else ""


async def _until(event: asyncio.Event, timeout: float) -> None:
    """Wait for ``event`` at most ``timeout`` seconds (a write of another process is not
    signalled: the caller looks again after the timeout)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)


def _endpoint(address: str, pod: PodRecord) -> Endpoint:
    return Endpoint(
        host=address,
        port=ENVD_PORT,
        pod_uid=pod.uid,
        memory_kept=pod.memory_kept,
        memory_note=pod.memory_note,
    )
