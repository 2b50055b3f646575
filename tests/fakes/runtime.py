"""In-memory fakes of the Runtime and Envd ports for fast tests of the lifecycle logic.

They model what matters for pause/resume: a workload's pod gets a fresh uid (and an empty
process table) every time it is scaled from 0 to 1; annotations are plain dicts; the daemon
lists and starts processes per pod. Faults can be injected (``envd.down``, ``runtime.fail_ready``).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime

from shared.errors import EnvdUnavailable, NotFound, PodNotReady, ReadyFailed
from shared.models.network import NetworkPolicy
from shared.models.snapshots import ProcessConfig, SnapshotProcess
from shared.ports.envd import CommandResult, InnerActivity
from shared.ports.workloads import ANNOTATION_PAUSE_MEMORY, Endpoint, Workload, WorkloadSpec


class FakeRuntime:
    def __init__(self) -> None:
        self.workloads: dict[str, Workload] = {}
        self.fail_ready = False
        self.ready_failure: str | None = None  # the daemon's "ready command not yet"
        self.scale_calls: list[tuple[str, int]] = []
        self._version = itertools.count(1)
        self._addresses = itertools.count(2)
        self._address: dict[str, str] = {}
        self.networks: dict[str, NetworkPolicy] = {}
        self.snapshot_files: dict[str, str] = {}  # snapshot id -> the workload it came from
        self.restored: list[tuple[str, str]] = []
        self.kept: list[str] = []  # keep_files calls (a pause's kept files)
        self.keep_failure: Exception | None = None  # keep_files raises this
        self.holds: list[tuple[str, float]] = []  # (name, hold) of each keep_files
        self.thawed: list[str] = []  # thaw_files calls
        self.thaw_failure: Exception | None = None  # thaw_files raises this
        self.stop_failure: Exception | None = None  # a scale to 0 raises this
        self.warm_pods = 0  # a scale to 1 takes one of these (a warm pool's pod) while any are left
        self._warm: set[str] = set()  # pod uids that came from the pool
        # A pause of a workload annotated torpor.dev/pause-memory=true keeps its pod (the local
        # runtime's CRIU dump): the next scale to 1 brings that pod back, ``memory_kept``.
        self.keeps_memory = False
        self._frozen: dict[str, str] = {}  # workload -> the pod uid a memory pause kept
        self._memory_kept: set[str] = set()  # pod uids that came back with their memory

    def _put(self, wl: Workload, **update: object) -> Workload:
        new = wl.model_copy(update={**update, "resource_version": str(next(self._version))})
        self.workloads[wl.name] = new
        return new

    async def create(self, spec: WorkloadSpec) -> Workload:
        if spec.name in self.workloads:
            return self.workloads[spec.name]
        if spec.template == "missing":
            raise NotFound(f"template {spec.template} not found")
        self._address[spec.name] = f"127.0.0.{next(self._addresses)}"
        self.networks[spec.name] = spec.network
        wl = Workload(
            name=spec.name,
            template=spec.template,
            labels=dict(spec.labels),
            annotations=dict(spec.annotations),
            replicas=0,
            resource_version="0",
        )
        self.workloads[spec.name] = wl
        return self._scale(spec.name, spec.replicas)

    async def get(self, name: str) -> Workload | None:
        return self.workloads.get(name)

    async def set_network(self, name: str, policy: NetworkPolicy) -> None:
        if name not in self.workloads:
            raise NotFound(f"workload {name} not found")
        self.networks[name] = policy

    async def patch_annotations(
        self,
        name: str,
        annotations: Mapping[str, str | None],
        *,
        resource_version: str | None = None,
    ) -> Workload:
        wl = self._require(name)
        merged = dict(wl.annotations)
        for k, v in annotations.items():
            if v is None:
                merged.pop(k, None)
            else:
                merged[k] = v
        return self._put(wl, annotations=merged)

    async def scale(self, name: str, replicas: int) -> None:
        self._scale(name, replicas)

    def _scale(self, name: str, replicas: int) -> Workload:
        wl = self._require(name)
        self.scale_calls.append((name, replicas))
        if replicas == 1 and wl.pod_uid is None and name in self._frozen:
            uid = self._frozen.pop(name)
            self._memory_kept.add(uid)
            return self._put(
                wl, replicas=1, ready_replicas=1, pod_uid=uid, pod_ip=self._address[name]
            )
        if replicas == 1 and wl.pod_uid is None:
            uid = str(uuid.uuid4())
            if self.warm_pods:
                self.warm_pods -= 1
                self._warm.add(uid)
            return self._put(
                wl,
                replicas=1,
                ready_replicas=1,
                pod_uid=uid,
                pod_ip=self._address[name],
            )
        if replicas == 0:
            if self.stop_failure is not None:
                raise self.stop_failure
            memory = wl.annotations.get(ANNOTATION_PAUSE_MEMORY) == "true"
            if self.keeps_memory and memory and wl.pod_uid is not None:
                self._frozen[name] = wl.pod_uid
            return self._put(wl, replicas=0, ready_replicas=0, pod_uid=None, pod_ip=None)
        return wl

    async def wait_ready(self, name: str, *, timeout: float, answering: bool = False) -> Endpoint:
        wl = self._require(name)
        await asyncio.sleep(0)
        if self.ready_failure is not None and not answering:
            raise ReadyFailed(f"pod of {name} not ready within {timeout:g}s: {self.ready_failure}")
        if self.fail_ready or wl.pod_uid is None or wl.pod_ip is None:
            raise PodNotReady(f"{name} not ready")
        return Endpoint(
            host=wl.pod_ip,
            pod_uid=wl.pod_uid,
            warm=wl.pod_uid in self._warm,
            memory_kept=wl.pod_uid in self._memory_kept,
        )

    async def wait_stopped(self, name: str, *, timeout: float) -> None:
        await asyncio.sleep(0)

    async def delete(self, name: str) -> None:
        self.workloads.pop(name, None)

    async def list(self, *, labels: Mapping[str, str] | None = None) -> list[Workload]:
        return [
            w
            for w in self.workloads.values()
            if not labels or all(w.labels.get(k) == v for k, v in labels.items())
        ]

    async def save_files(self, name: str, snapshot_id: str) -> int:
        self._require(name)
        self.snapshot_files[snapshot_id] = name
        return 0

    async def restore_files(self, snapshot_id: str, name: str) -> None:
        self._require(name)
        if snapshot_id not in self.snapshot_files:
            raise NotFound(f"snapshot {snapshot_id} has no files")
        self.restored.append((snapshot_id, name))

    async def delete_snapshot_files(self, snapshot_id: str) -> None:
        self.snapshot_files.pop(snapshot_id, None)

    async def keep_files(self, name: str, *, hold: float = 0) -> int:
        self._require(name)
        if self.keep_failure is not None:
            raise self.keep_failure
        self.kept.append(name)
        self.holds.append((name, hold))
        return 0

    async def thaw_files(self, name: str) -> None:
        self.thawed.append(name)
        if self.thaw_failure is not None:
            raise self.thaw_failure

    async def close(self) -> None:
        return None

    def _require(self, name: str) -> Workload:
        if name not in self.workloads:
            raise NotFound(f"workload {name} not found")
        return self.workloads[name]


class FakeEnvd:
    def __init__(self) -> None:
        self.pods: dict[str, list[SnapshotProcess]] = {}  # pod uid -> live processes
        self.started: dict[str, int] = {}  # pod uid -> number of Start calls
        self.down = False
        self.fail_cmds: set[str] = set()
        self._pids = itertools.count(100)
        # run_command: what ran (pod uid, command, user), and scripted results by command
        self.commands: list[tuple[str, str, str]] = []
        self.results: dict[str, CommandResult] = {}
        self.inner: dict[str, InnerActivity] = {}  # pod uid -> what GET /activity answers

    async def list_processes(
        self, endpoint: Endpoint, *, access_token: str | None, timeout: float = 10.0
    ) -> list[SnapshotProcess]:
        if self.down:
            raise EnvdUnavailable("daemon down")
        return list(self.pods.get(endpoint.pod_uid, []))

    async def start_process(
        self,
        endpoint: Endpoint,
        config: ProcessConfig,
        *,
        tag: str | None,
        access_token: str | None,
        timeout: float = 10.0,
    ) -> int:
        if self.down:
            raise EnvdUnavailable("daemon down")
        if config.cmd in self.fail_cmds:
            raise FileNotFoundError(config.cmd)
        pid = next(self._pids)
        self.pods.setdefault(endpoint.pod_uid, []).append(
            SnapshotProcess(config=config, pid=pid, tag=tag)
        )
        self.started[endpoint.pod_uid] = self.started.get(endpoint.pod_uid, 0) + 1
        return pid

    async def run_command(
        self,
        endpoint: Endpoint,
        command: str,
        *,
        user: str,
        timeout: float,
        access_token: str | None,
        envs: dict[str, str] | None = None,
    ) -> CommandResult:
        if self.down:
            raise EnvdUnavailable("daemon down")
        self.commands.append((endpoint.pod_uid, command, user))
        return self.results.get(command, CommandResult(exit_code=0))

    async def activity(
        self, endpoint: Endpoint, *, access_token: str | None, timeout: float = 2.0
    ) -> InnerActivity:
        if self.down:
            raise EnvdUnavailable("daemon down")
        return self.inner.get(endpoint.pod_uid) or InnerActivity(now=datetime.now(UTC), last={})

    async def health(self, endpoint: Endpoint, *, timeout: float = 2.0) -> bool:
        return not self.down

    async def close(self) -> None:
        return None
