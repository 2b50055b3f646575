"""The local runtime: ReplicaSet-shaped workloads as bubblewrap-isolated process trees.

Each workload has one record in NATS KV (``torpor_workloads``) and one loopback address
(127.0.x.y, reserved in the same bucket for the workload's lifetime). Its pod is the in-sandbox
daemon (``python -m services.envd``) under ``bwrap`` with its own PID/IPC/UTS namespaces, the host
network (it listens on its own 127.0.x.y:49983), a read-only view of the OS and of torpor's code,
a fresh ``/workspace`` that is deleted when the pod stops, and the template's volumes (host
directories kept across pauses). "Ready" means the daemon's ``/health`` answers 2xx.

A reconciler makes the processes match the records, like a ReplicaSet controller: it starts a pod
when ``replicas`` is 1 and none runs (crashed pods are restarted with a back-off), and stops pods
of workloads scaled to 0 or deleted. Pods do not depend on the runtime that started them: after a
``kill -9`` of the owner the next ``LocalRuntime`` adopts the running pods (found by pid and pod
uid) and stops strays (pods without a record); ``close()`` stops every pod of its data dir
(``stop_pods_on_close``) while keeping ``replicas``, so the next start brings them back.

Isolation is not a VM's: pods share the host's network namespace (they must listen on loopback)
and therefore reach every loopback service, including NATS; they run as root with no
capabilities, see a read-only OS and torpor's code, and cannot see other pods' files or processes.

Resource limits (``resources.limits`` of the template):
- on a host with a writable cgroup v2 hierarchy that delegates memory, cpu and pids: one cgroup
  per pod enforces ``memory`` (no swap), ``cpu`` (quota) and ``pids`` for the whole pod;
- otherwise (cgroup v1, containers without delegation): ``prlimit`` sets RLIMIT_AS to ``memory``
  per process (address space, not resident memory) and RLIMIT_NOFILE to ``nofile``; ``cpu`` and
  ``pids`` are NOT enforced (RLIMIT_NPROC does not bind root). There are no disk quotas:
  ``/workspace`` and volumes live on the host's data dir filesystem.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import shutil
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import httpx
import nats
import structlog
from nats.aio.client import Client
from nats.js.api import KeyValueConfig
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

from shared.errors import Conflict, NotFound, PodNotReady, RuntimeFailure, Unavailable
from shared.models.network import NetworkPolicy
from shared.runtime.local import pods
from shared.runtime.local.records import PodRecord, WorkloadRecord, WorkloadStore
from shared.runtime.models import (
    ENVD_PORT,
    LABEL_MANAGED_BY,
    LABEL_OWNER,
    LABEL_SANDBOX_ID,
    MANAGED_BY,
    Endpoint,
    Workload,
    WorkloadSpec,
)
from shared.runtime.templates import Template, load_template, template_dirs

log = structlog.get_logger()

DEFAULT_BUCKET = "torpor_workloads"
# Kubernetes' limit for all annotations of one object; the local runtime enforces the same.
MAX_ANNOTATIONS_BYTES = 256 * 1024
_BACKOFF_MAX = 30.0
ENV_ACCESS_TOKEN = "ENVD_ACCESS_TOKEN"  # noqa: S105 - a variable name, read by the daemon


class LocalRuntime:
    """The embedded default implementation of :class:`shared.runtime.ports.Runtime`."""

    def __init__(
        self,
        *,
        nats_url: str,
        data_dir: Path,
        templates_dir: Path | None = None,
        bucket: str = DEFAULT_BUCKET,
        bwrap: str = "bwrap",
        python: str = sys.executable,
        stop_grace: float = 2.0,
        supervise: bool = True,
        stop_pods_on_close: bool = True,
        first_address: str = "127.0.0.2",
        poll_interval: float = 1.0,
    ) -> None:
        self._nats_url = nats_url
        self._data_dir = data_dir.resolve()
        self._template_dirs = template_dirs(templates_dir)
        self._bucket = bucket
        self._bwrap = bwrap
        self._python = python
        self._stop_grace = stop_grace
        self._supervise = supervise
        self._stop_pods_on_close = stop_pods_on_close
        self._first_address = tuple(int(p) for p in first_address.split("."))
        self._poll_interval = poll_interval
        self._nc: Client | None = None
        self._store_: WorkloadStore | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        self._pending: set[str] = set()
        self._starting: set[str] = set()  # pod uids spawned but not yet recorded
        self._tasks: set[asyncio.Task[None]] = set()
        self._cgroup_parent: Path | None = None
        self._closing = False

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self) -> LocalRuntime:
        await pods.check_bwrap(self._bwrap)
        (self._data_dir / "pods").mkdir(parents=True, exist_ok=True)
        (self._data_dir / "logs").mkdir(parents=True, exist_ok=True)
        self._cgroup_parent = await asyncio.to_thread(pods.cgroup_parent)
        await _precompile_once(self._python)
        try:
            self._nc = await nats.connect(self._nats_url, max_reconnect_attempts=-1)
        except Exception as e:  # nats-py raises several unrelated types on connect failure
            msg = f"cannot connect to NATS at {self._nats_url}: {e}"
            raise Unavailable(msg) from e
        self._store_ = WorkloadStore(await self._bucket_kv())
        if self._supervise:
            await self._reconcile_all(stray_sweep=True)
            self._spawn_task(self._monitor())
        log.info(
            "runtime.local.started", data_dir=str(self._data_dir), cgroups=bool(self._cgroup_parent)
        )
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
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
        try:
            if self._stop_pods_on_close and self._store_ is not None:
                await self._stop_everything()
        finally:
            if self._stop_pods_on_close:  # even when NATS is gone: never leave orphans
                await self._stop_strays(set())
            if self._nc is not None:
                await self._nc.close()

    async def _bucket_kv(self) -> KeyValue:
        assert self._nc is not None
        js = self._nc.jetstream()
        try:
            return await js.key_value(self._bucket)
        except BucketNotFoundError:
            return await js.create_key_value(KeyValueConfig(bucket=self._bucket, history=5))

    @property
    def _store(self) -> WorkloadStore:
        if self._store_ is None:
            msg = "LocalRuntime used before start()"
            raise RuntimeFailure(msg)
        return self._store_

    # ---- the port ----------------------------------------------------------------------

    async def create(self, spec: WorkloadSpec) -> Workload:
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
        address = await self._reserve_address(spec.name)
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
        )
        revision = await self._store.create(record)
        if revision is None:  # lost a create race: the other one stands
            await self._store.release_address(address)
            current = await self._store.get(spec.name)
            if current is None:
                msg = f"workload {spec.name} vanished while being created"
                raise Conflict(msg)
            return self._view(*current)
        log.info("runtime.local.created", workload=spec.name, address=address)
        self._kick(spec.name)
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
        self._kick(name)
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
        self._kick(name)

    async def wait_ready(self, name: str, *, timeout: float) -> Endpoint:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=1.0, trust_env=False) as client:
            while True:
                current = await self._store.get(name)
                if current is None or current[0].deleting:
                    msg = f"workload {name} not found"
                    raise NotFound(msg)
                record, _ = current
                pod = record.pod
                # The daemon binds before importing its app: one patient probe is the fastest.
                patience = max(0.05, min(deadline - time.monotonic(), 5.0))
                if pod is not None and await self._healthy(client, record.address, patience):
                    if pod.ready or await self._mark_ready(name, pod.uid):
                        return Endpoint(host=record.address, port=ENVD_PORT, pod_uid=pod.uid)
                    continue  # replaced or stopped meanwhile: look again
                if time.monotonic() >= deadline:
                    msg = f"pod of {name} not ready within {timeout:g}s{self._log_tail(record)}"
                    raise PodNotReady(msg)
                await asyncio.sleep(0.02)

    async def wait_stopped(self, name: str, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            current = await self._store.get(name)
            if current is None:
                return
            record, _ = current
            if record.pod is None and not record.terminating:
                return
            if time.monotonic() >= deadline:
                msg = f"pod of {name} still running after {timeout:g}s"
                raise RuntimeFailure(msg)
            await asyncio.sleep(0.02)

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
        await self._reconcile(name)

    async def list(self, *, labels: Mapping[str, str] | None = None) -> list[Workload]:
        out = []
        for name in await self._store.names():
            current = await self._store.get(name)
            if current is None or current[0].deleting:
                continue
            record, revision = current
            if labels and any(record.labels.get(k) != v for k, v in labels.items()):
                continue
            out.append(self._view(record, revision))
        return out

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

    async def _healthy(self, client: httpx.AsyncClient, address: str, patience: float) -> bool:
        try:
            response = await client.get(f"http://{address}:{ENVD_PORT}/health", timeout=patience)
        except httpx.HTTPError:
            return False
        return response.is_success

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

    async def _reserve_address(self, name: str) -> str:
        a, b, c, d = self._first_address
        taken = set(await self._store.reserved_addresses())
        for third in range(c, 256):
            for fourth in range(d if third == c else 2, 255):
                address = f"{a}.{b}.{third}.{fourth}"
                if address in taken or await _port_open(address, ENVD_PORT):
                    continue
                if await self._store.reserve_address(address, name):
                    return address
        msg = "no free loopback address left for a local pod"
        raise RuntimeFailure(msg)

    # ---- reconciliation ----------------------------------------------------------------

    def _spawn_task(self, coro: object) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _kick(self, name: str, *, after: float = 0.0) -> None:
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
                await self._reconcile(name)
            except Exception:
                log.exception("runtime.local.reconcile_failed", workload=name)

        self._spawn_task(run())

    async def _monitor(self) -> None:
        # Checks _closing too: nats-py can turn a cancellation into another exception.
        while not self._closing:
            await asyncio.sleep(self._poll_interval)
            try:
                await self._reconcile_all(stray_sweep=False)
            except Exception:
                log.exception("runtime.local.monitor_failed")

    async def _reconcile_all(self, *, stray_sweep: bool) -> None:
        names = await self._store.names()
        for name in names:
            current = await self._store.get(name)
            if current is not None and _needs_work(current[0]):
                self._kick(name)
        if stray_sweep:
            await self._stop_strays(set(names))
            await self._release_orphan_addresses(set(names))

    async def _stop_strays(self, names: set[str]) -> None:
        known: set[str] = set()
        for name in names:
            current = await self._store.get(name)
            if current is not None:
                known.update(p.uid for p in current[0].terminating)
                if current[0].pod is not None:
                    known.add(current[0].pod.uid)
        for found in await asyncio.to_thread(pods.scan_pods, self._data_dir):
            if found.uid not in known and found.uid not in self._starting:
                log.info("runtime.local.stray_stopped", workload=found.workload, pod_uid=found.uid)
                await pods.stop_pod(found.uid, runtime_root=self._data_dir, grace=self._stop_grace)
                await asyncio.to_thread(_remove_pod_dir, self._data_dir / "pods" / found.uid)

    async def _release_orphan_addresses(self, names: set[str]) -> None:
        for address in await self._store.reserved_addresses():
            holder = await self._store.address_holder(address)
            if holder is not None and holder not in names:
                await self._store.release_address(address)

    async def _reconcile(self, name: str) -> None:
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            self._pending.discard(name)
            with contextlib.suppress(NotFound):  # deleted meanwhile (by another runtime)
                while await self._reconcile_step(name):
                    pass

    async def _reconcile_step(self, name: str) -> bool:
        """One step towards the record's desired state; True when another step is needed."""
        current = await self._store.get(name)
        if current is None:
            return False
        record, revision = current
        if record.terminating:
            for pod in record.terminating:
                await self._cleanup(pod)
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
                with contextlib.suppress(Conflict):
                    await self._store.remove(name, last=revision)
                    await self._store.release_address(record.address)
                    log.info("runtime.local.deleted", workload=name)
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
            if pods.is_pod_alive(record.pod.pid, record.pod.uid):
                return False
            await self._pod_died(record)
            return True
        wait = record.not_before - time.time()
        if wait > 0:
            self._kick(name, after=wait)
            return False
        await self._start_pod(record)
        return False

    async def _pod_died(self, record: WorkloadRecord) -> None:
        dead = record.pod
        assert dead is not None
        backoff = min(0.5 * 2**record.restarts, _BACKOFF_MAX)
        log.warning(
            "runtime.local.pod_died", workload=record.name, pod_uid=dead.uid, restart_in=backoff
        )

        def change(r: WorkloadRecord) -> WorkloadRecord | None:
            if r.pod is None or r.pod.uid != dead.uid:
                return None
            return r.model_copy(
                update={
                    "pod": None,
                    "restarts": r.restarts + 1,
                    "not_before": time.time() + backoff,
                }
            )

        await self._store.mutate(record.name, change)
        await self._cleanup(dead, keep_log_as=record.name)

    async def _start_pod(self, record: WorkloadRecord) -> None:
        template = await asyncio.to_thread(load_template, record.template, self._template_dirs)
        uid = str(uuid.uuid4())
        pod_dir = self._data_dir / "pods" / uid
        workspace = pod_dir / "workspace"
        await asyncio.to_thread(workspace.mkdir, parents=True)
        mounts = []
        for volume in template.volumes:
            source = volume.resolve(self._data_dir, sandbox_id=record.name, owner=record.owner)
            await asyncio.to_thread(source.mkdir, parents=True, exist_ok=True)
            mounts.append(
                pods.Mount(source=source, target=volume.mount_path, read_only=volume.read_only)
            )
        launch = pods.PodLaunch(
            bwrap=self._bwrap,
            uid=uid,
            workload=record.name,
            runtime_root=self._data_dir,
            workspace=workspace,
            workdir=template.workdir,
            mounts=mounts,
            env=self._pod_env(template, record),
            command=self._command(template, record),
            code_dirs=await asyncio.to_thread(pods.code_dirs),
            hostname=record.name,
        )
        limits = template.resources.limits
        pod_limits = pods.Limits(
            memory_bytes=limits.memory_bytes,
            cpu_millis=limits.cpu_millis,
            pids=limits.pids,
            nofile=limits.nofile,
        )
        cgroup = None
        if self._cgroup_parent is not None:
            cgroup = await asyncio.to_thread(pods.make_cgroup, self._cgroup_parent, uid, pod_limits)
        self._starting.add(uid)
        try:
            try:
                env_fd = await asyncio.to_thread(
                    pods.open_env_file, pod_dir / "env.args", launch.env
                )
                try:
                    argv = [
                        *pods.limit_wrapper(pod_limits, cgroup),
                        *pods.bwrap_argv(launch, env_fd=env_fd),
                    ]
                    process = await pods.spawn(argv, pod_dir / "pod.log", pass_fds=[env_fd])
                finally:
                    os.close(env_fd)
            except OSError as e:
                await asyncio.to_thread(_remove_pod_dir, pod_dir)
                msg = f"cannot start a pod for {record.name}: {e}"
                raise RuntimeFailure(msg) from e
            pod = PodRecord(uid=uid, pid=process.pid, started_at=time.time(), pod_dir=str(pod_dir))

            def change(r: WorkloadRecord) -> WorkloadRecord | None:
                if r.pod is not None or r.replicas != 1 or r.deleting:
                    return None
                return r.model_copy(update={"pod": pod})

            current, _ = await self._store.mutate(record.name, change)
        finally:
            self._starting.discard(uid)
        if current.pod is None or current.pod.uid != uid:  # someone else won, or scaled to 0
            await self._cleanup(pod)
            return
        log.info("runtime.local.pod_started", workload=record.name, pod_uid=uid, pid=process.pid)
        self._spawn_task(self._watch_exit(record.name, process))

    async def _watch_exit(self, name: str, process: asyncio.subprocess.Process) -> None:
        await process.wait()  # also reaps the child
        self._kick(name)

    def _pod_env(self, template: Template, record: WorkloadRecord) -> dict[str, str]:
        system_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        path = f"{Path(sys.base_prefix) / 'bin'}:{system_path}"
        env = {
            "PATH": path,
            **template.env,
            **record.envs,
            "E2B_SANDBOX": "true",
            "E2B_SANDBOX_ID": record.name,
        }
        if record.access_token:
            # Not ``--access-token`` in argv: visible in ``ps``, and a token starting with "-"
            # would be read as an option. The daemon drops it from the environment it hands on.
            env[ENV_ACCESS_TOKEN] = record.access_token
        return env

    def _command(self, template: Template, record: WorkloadRecord) -> builtins.list[str]:
        if template.command is not None:
            values = {
                "python": self._python,
                "host": record.address,
                "port": str(ENVD_PORT),
                "root": "/workspace",
            }
            return [part.format(**values) for part in template.command]
        return [
            self._python,
            "-m",
            "services.envd",
            "--listen",
            f"{record.address}:{ENVD_PORT}",
            "--root",
            "/workspace",
        ]

    async def _cleanup(self, pod: PodRecord, *, keep_log_as: str | None = None) -> None:
        """Stop (if needed) and discard a pod: its workspace goes, like a container's disk."""
        await pods.stop_pod(pod.uid, runtime_root=self._data_dir, grace=self._stop_grace)
        pod_dir = Path(pod.pod_dir)
        if keep_log_as is not None:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(
                    shutil.copyfile,
                    pod_dir / "pod.log",
                    self._data_dir / "logs" / f"{keep_log_as}.last.log",
                )
        await asyncio.to_thread(_remove_pod_dir, pod_dir)
        if self._cgroup_parent is not None:
            await asyncio.to_thread(pods.remove_cgroup, self._cgroup_parent / pod.uid)

    async def _stop_everything(self) -> None:
        """Stop every pod of this data dir; ``replicas`` stay, so the next start restarts them."""
        for name in await self._store.names():
            current = await self._store.get(name)
            if current is None:
                continue
            record = current[0]
            for pod in [*record.terminating, *([record.pod] if record.pod else [])]:
                await self._cleanup(pod)

            def change(r: WorkloadRecord) -> WorkloadRecord:
                return r.model_copy(update={"pod": None, "terminating": []})

            with contextlib.suppress(NotFound):
                await self._store.mutate(name, change)
        await self._stop_strays(set())


_precompiled: set[str] = set()  # interpreters whose daemon bytecode this process checked


async def _precompile_once(python: str) -> None:
    if python in _precompiled:
        return
    _precompiled.add(python)
    if await asyncio.to_thread(pods.daemon_bytecode_stale):
        await pods.precompile_daemon(python)


def _needs_work(record: WorkloadRecord) -> bool:
    if record.terminating or record.deleting:
        return True
    if record.replicas == 0:
        return record.pod is not None
    if record.pod is None:
        return record.not_before <= time.time()  # else a delayed reconcile is already queued
    return not pods.is_pod_alive(record.pod.pid, record.pod.uid)


def _pod_to_terminating(record: WorkloadRecord) -> WorkloadRecord | None:
    if record.pod is None:
        return None
    return record.model_copy(update={"pod": None, "terminating": [*record.terminating, record.pod]})


def _check_annotations(annotations: Mapping[str, str]) -> None:
    size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    if size > MAX_ANNOTATIONS_BYTES:
        msg = f"annotations total {size} bytes, over the {MAX_ANNOTATIONS_BYTES}-byte limit"
        raise RuntimeFailure(msg)


def _remove_pod_dir(pod_dir: Path) -> None:
    shutil.rmtree(pod_dir, ignore_errors=True)


async def _port_open(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=0.5)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True
