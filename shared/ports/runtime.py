"""The runtime port: the one narrow interface the snapshotter and scaler use to move workloads.

Both adapters (``shared.runtime.local`` and ``shared.runtime.kubernetes``) implement it and both
pass ``tests/contract/test_runtime_contract.py``. Errors are torpor's own (``shared.errors``):
``NotFound`` for a missing workload, ``Conflict`` for a stale ``resource_version``,
``PodNotReady`` when waiting times out, ``RuntimeFailure`` for anything else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from shared.models.network import NetworkPolicy
from shared.ports.workloads import Endpoint, Workload, WorkloadSpec


class Runtime(Protocol):
    async def create(self, spec: WorkloadSpec) -> Workload:
        """Create the workload (idempotent: an existing one with the same name is returned)."""
        ...

    async def get(self, name: str) -> Workload | None:
        """The workload, or ``None`` when it does not exist."""
        ...

    async def patch_annotations(
        self,
        name: str,
        annotations: Mapping[str, str | None],
        *,
        resource_version: str | None = None,
    ) -> Workload:
        """Merge annotations (``None`` removes a key). With ``resource_version`` the patch only
        applies if the workload is unchanged since; otherwise ``Conflict``."""
        ...

    async def scale(self, name: str, replicas: int) -> None:
        """Set desired replicas to 0 or 1 (idempotent). Returns nothing: ``get`` reads the
        workload when needed (on Kubernetes that is two more requests, on a resume's path)."""
        ...

    async def set_network(self, name: str, policy: NetworkPolicy) -> None:
        """Replace the workload's network policy; applies to its running pod at once and to
        every later pod (kept across scale 0/1). ``NotFound`` for a missing workload."""
        ...

    async def wait_ready(self, name: str, *, timeout: float, answering: bool = False) -> Endpoint:
        """Wait until a *new*, non-terminating pod of the workload is Ready; its daemon endpoint.
        Raises ``PodNotReady`` after ``timeout`` seconds (``ReadyFailed`` when its daemon is up
        but the template's ready command kept failing). ``answering``: return once the daemon
        answers at all, also while it still waits for the ready command (a resume replays the
        start command the ready command may depend on before it waits for ready)."""
        ...

    async def wait_stopped(self, name: str, *, timeout: float) -> None:
        """Wait until no pod of the workload exists any more (after scale to 0)."""
        ...

    async def delete(self, name: str) -> None:
        """Delete the workload and its pods (idempotent: a missing one is fine)."""
        ...

    async def list(self, *, labels: Mapping[str, str] | None = None) -> list[Workload]:
        """Workloads whose labels include ``labels`` (all torpor workloads when ``None``)."""
        ...

    async def keep_files(self, name: str, *, hold: float = 0) -> int:
        """Before a pause scales the workload to 0 (its processes captured): keep the files its
        pod's disk would lose, so its next pod (cold or warm) gets them back before any process
        is replayed; the bytes kept. 0 where the disk outlives the pod (the local runtime, a
        Kubernetes claim) or nothing is kept (``persist: none``). Raises (the pause fails, the
        pod keeps running) when they cannot be kept: never a pod stopped with files lost.
        The pod's processes are stopped while the files are taken (one moment's tree) and, with
        ``hold`` seconds (at most 600), stay stopped that long after (until ``thaw_files``), so
        the pod stops with nothing written after the copy; a failure continues them at once."""
        ...

    async def thaw_files(self, name: str) -> None:
        """Continue the processes a ``keep_files`` with a hold left stopped (the pause failed
        after it). Idempotent; nothing to do where nothing was held. Raises on a daemon that
        cannot be reached (callers treat it as best effort: the hold runs out anyway)."""
        ...

    # ---- files of stored snapshots (E2B create_snapshot / fork) ----------------------------

    async def save_files(self, name: str, snapshot_id: str) -> int:
        """Copy the workload's writable files into the stored snapshot ``snapshot_id`` (the
        sandbox keeps running); the bytes stored. Idempotent. ``Unsupported`` where this runtime
        cannot keep files: a snapshot is refused rather than stored without them."""
        ...

    async def restore_files(self, snapshot_id: str, name: str) -> None:
        """Give the workload's current pod the snapshot's files, before any process of it is
        replayed. Once per pod (idempotent). ``NotFound`` when the snapshot's files are gone."""
        ...

    async def delete_snapshot_files(self, snapshot_id: str) -> None:
        """Remove a snapshot's files (idempotent)."""
        ...

    async def close(self) -> None:
        """Release clients, watches and (local runtime) supervised processes' bookkeeping."""
        ...
