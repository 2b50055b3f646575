"""A tiny kubelet for tests: runs each torpor pod as the in-sandbox daemon on 127.0.x.y:49983.

There is no container runtime on the test machines. This kubelet registers a Node, keeps it
Ready and its Lease fresh, binds pending torpor pods to itself (there is no scheduler; gated pods wait), starts
each bound pod as ``python -m services.envd`` under bubblewrap (own PID namespace, fresh
``/workspace``), reports ``Running``/``Ready`` with ``podIP`` = its loopback address, and on
``deletionTimestamp`` stops the process and deletes the pod with grace 0 and a uid
precondition, as a real kubelet does. A pod's address is its own until its daemon is stopped:
locked in a folder every test kubelet of the machine shares, as another test run's kubelet
hands out addresses from the same block.

It runs in its own thread with its own event loop and talks to the API server with the official
client's asyncio flavour (``kubernetes.aio``), so it works under sync and async fixtures alike.
Only pods labelled ``app.kubernetes.io/managed-by=torpor`` are touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import ipaddress
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from kubernetes.aio import client as k8s
from kubernetes.aio import config as k8s_config
from kubernetes.aio import watch as k8s_watch
from kubernetes.aio.client.exceptions import ApiException

from shared.ports.workloads import ENVD_PORT, LABEL_MANAGED_BY, MANAGED_BY
from shared.runtime.local import bwrap as local_bwrap
from shared.runtime.local import procfs
from tests.support.k8s import provisioner

log = structlog.get_logger()
REPO_ROOT = Path(__file__).resolve().parents[3]
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
ACCESS_TOKEN_ENV = "ENVD_ACCESS_TOKEN"
# Where every test kubelet on this machine (any test run, any worktree) locks the addresses its
# pods hold: a daemon binds its address a moment after it is handed out, and until then nothing
# else shows the address is taken.
IP_LOCKS = Path(tempfile.gettempdir()) / f"torpor-test-kubelet-ips-{os.getuid()}"


def real_envd_available() -> bool:
    return (REPO_ROOT / "services" / "envd" / "__main__.py").is_file()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _rfc3339(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class PodRun:
    uid: str
    namespace: str
    name: str
    ip: str
    root: Path
    proc: asyncio.subprocess.Process | None = None
    terminating: bool = False
    # From the pod's volumes: the folder bound as /workspace (``root`` unless a volume is
    # mounted there) and the other volume mounts of the daemon's container.
    workspace: Path | None = None
    mounts: list[local_bwrap.Mount] = field(default_factory=list)
    watcher: asyncio.Task[None] | None = None
    # Until its process exists (or will not be started): a stop meanwhile leaves the address
    # held, as the daemon may still be started on it; the start then stops it and frees it.
    starting: bool = False


@dataclass
class TestKubelet:
    kubeconfig: Path
    workdir: Path
    node_name: str = "torpor-test-node"
    # Pods get addresses from this loopback block; 127.0.0.x is left to the local runtime.
    ip_network: str = "127.0.3.0/24"
    ip_locks: Path = IP_LOCKS
    use_bwrap: bool = True
    # Tests set this to keep a deleted pod Terminating for a while (as a slow shutdown would).
    termination_delay: float = 0.0
    lease_interval: float = 10.0
    started_pods: list[str] = field(default_factory=list)  # uids, in start order
    begun_pods: list[str] = field(default_factory=list)  # names of pods it began to start
    # For benchmarks: seconds from seeing a bound pod to its daemon answering /health.
    daemon_start_seconds: list[float] = field(default_factory=list)
    _pods: dict[str, PodRun] = field(default_factory=dict)
    _thread: threading.Thread | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None
    _ready: threading.Event = field(default_factory=threading.Event)
    _error: BaseException | None = None
    # address -> the uid of the pod holding it, and the descriptor of its lock in ``ip_locks``
    _ips_in_use: dict[str, tuple[str, int]] = field(default_factory=dict)

    __test__ = False  # not a pytest test class

    # ------------------------------------------------------------ lifecycle (any thread)

    def start(self, *, timeout: float = 60.0) -> TestKubelet:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="test-kubelet", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            msg = "test kubelet did not register its node in time"
            raise RuntimeError(msg)
        if self._error is not None:
            raise RuntimeError(f"test kubelet failed: {self._error!r}") from self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None

    @property
    def volumes_dir(self) -> Path:
        """Where the rig's provisioner keeps each bound claim's folder (``<claim uid>/``)."""
        return self.workdir / "volumes"

    def running_ips(self) -> dict[str, str]:
        """uid -> pod IP of pods whose daemon process is alive."""
        return {
            uid: run.ip
            for uid, run in list(self._pods.items())
            if run.proc is not None and run.proc.returncode is None
        }

    def pid_of(self, uid: str) -> int | None:
        """The pid of the process started for pod ``uid`` (the outer bwrap), if running."""
        run = self._pods.get(uid)
        if run is None or run.proc is None or run.proc.returncode is not None:
            return None
        return run.proc.pid

    def pod_name(self, uid: str) -> str | None:
        run = self._pods.get(uid)
        return run.name if run is not None else None

    def pods_at(self, ip: str) -> list[str]:
        """The pods this kubelet has on address ``ip`` (for a failing test's message): name,
        uid, whether their daemon runs or how it ended, and the last line of its log."""
        found = []
        for run in list(self._pods.values()):
            if run.ip != ip:
                continue
            proc = run.proc
            state = "never started" if proc is None else f"exit {proc.returncode}"
            if proc is not None and proc.returncode is None:
                state = "running"
            lines = _tail(self.workdir / "pods" / run.uid / "daemon.log")
            found.append(f"{run.name} ({run.uid}, {state}: {lines[-1] if lines else 'no log'})")
        return found

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        api = await k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig)
        )
        tasks: list[asyncio.Task[None]] = []
        try:
            self._core = k8s.CoreV1Api(api)
            self._coord = k8s.CoordinationV1Api(api)
            await self._register_node()
            await self._renew_lease()
            tasks = [
                asyncio.create_task(self._lease_loop()),
                asyncio.create_task(self._pod_loop()),
                # The rig's storage: claims bound to hostPath volumes under the workdir.
                asyncio.create_task(provisioner.provision(self._core, self.volumes_dir)),
            ]
            self._ready.set()
            await self._stop.wait()
        except BaseException as e:
            self._error = e
            self._ready.set()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(
                *(self._kill(run) for run in list(self._pods.values())), return_exceptions=True
            )
            for _, fd in self._ips_in_use.values():  # pods still starting (die with this thread)
                os.close(fd)
            self._ips_in_use.clear()
            await api.close()

    # ------------------------------------------------------------ node and lease

    async def _register_node(self) -> None:
        node = k8s.V1Node.model_validate(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": self.node_name,
                    "labels": {
                        "kubernetes.io/hostname": self.node_name,
                        "torpor.dev/test-kubelet": "true",
                    },
                },
            }
        )
        try:
            await self._core.create_node(node)
        except ApiException as e:
            if e.status != 409:
                raise
        now = _rfc3339(_now())
        status: dict[str, Any] = {
            "status": {
                "capacity": {"cpu": "64", "memory": "256Gi", "pods": "250"},
                "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "250"},
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "torpor test kubelet",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
                "nodeInfo": {
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                    "kubeletVersion": "v1.36.3",
                    "kubeProxyVersion": "",
                    "bootID": "",
                    "machineID": "",
                    "systemUUID": "",
                    "containerRuntimeVersion": "bubblewrap://",
                    "kernelVersion": "",
                    "osImage": "",
                },
            }
        }
        await self._core.patch_node_status(self.node_name, status, _content_type=STRATEGIC)

    async def _renew_lease(self) -> None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.node_name, "namespace": "kube-node-lease"},
            "spec": {
                "holderIdentity": self.node_name,
                "leaseDurationSeconds": 40,
                "renewTime": _now().strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            },
        }
        try:
            await self._coord.patch_namespaced_lease(
                self.node_name, "kube-node-lease", {"spec": body["spec"]}, _content_type=MERGE
            )
        except ApiException as e:
            if e.status != 404:
                raise
            await self._coord.create_namespaced_lease(
                "kube-node-lease", k8s.V1Lease.model_validate(body)
            )

    async def _lease_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_interval)
            try:
                await self._renew_lease()
            except Exception as e:  # keep renewing; one failed renewal is harmless
                log.warning("test_kubelet.lease_failed", error=repr(e))

    # ------------------------------------------------------------ pods

    async def _pod_loop(self) -> None:
        selector = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
        while True:
            try:
                listed = await self._core.list_pod_for_all_namespaces(label_selector=selector)
                for pod in listed.items:
                    self._on_pod("ADDED", pod)
                async with k8s_watch.Watch() as w:  # type: ignore[no-untyped-call]
                    stream = w.stream(
                        self._core.list_pod_for_all_namespaces,
                        label_selector=selector,
                        resource_version=listed.metadata.resource_version
                        if listed.metadata
                        else None,
                        timeout_seconds=300,
                        allow_watch_bookmarks=True,
                    )
                    async for event in stream:
                        self._on_pod(event["type"], event["object"])
            except asyncio.CancelledError:
                raise
            except Exception as e:  # 410 Gone, dropped connection: relist
                log.info("test_kubelet.rewatch", error=repr(e))
                await asyncio.sleep(0.5)

    def _on_pod(self, kind: str, pod: Any) -> None:
        if kind not in ("ADDED", "MODIFIED", "DELETED") or pod.metadata is None:
            return
        uid = pod.metadata.uid
        spec = pod.spec
        if kind == "DELETED":
            if run := self._pods.get(uid):
                self._spawn(self._kill(run))
            return
        if not spec.node_name:
            # As kube-scheduler: a pod with scheduling gates waits until they are all lifted.
            if pod.metadata.deletion_timestamp is None and not spec.scheduling_gates:
                self._spawn(self._bind(pod))
            return
        if spec.node_name != self.node_name:
            return
        run = self._pods.get(uid)
        if pod.metadata.deletion_timestamp is not None:
            if run is None:
                run = PodRun(uid, pod.metadata.namespace, pod.metadata.name, "", Path())
                self._pods[uid] = run
            if not run.terminating:
                run.terminating = True
                self._spawn(self._terminate(run))
            return
        phase = pod.status.phase if pod.status else None
        if run is None and phase not in ("Failed", "Succeeded"):
            # Claim the pod synchronously so a second event cannot start it twice.
            run = PodRun(
                uid, pod.metadata.namespace, pod.metadata.name, self._allocate_ip(uid), Path()
            )
            run.root = self.workdir / "pods" / uid / "workspace"
            run.starting = True
            self._pods[uid] = run
            self.begun_pods.append(pod.metadata.name)
            self._spawn(self._start_pod(run, pod))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        task.add_done_callback(self._report)

    @staticmethod
    def _report(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("test_kubelet.task_failed", error=repr(exc))

    async def _bind(self, pod: Any) -> None:
        body = k8s.V1Binding.model_validate(
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": pod.metadata.name, "uid": pod.metadata.uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
            }
        )
        try:
            # The generated client cannot decode the Binding response; read it raw.
            resp = await self._core.create_namespaced_binding_without_preload_content(
                pod.metadata.namespace, body
            )
            await resp.read()
            resp.release()
        except ApiException as e:
            if e.status not in (404, 409):  # gone, or already bound
                raise

    def _allocate_ip(self, uid: str) -> str:
        """A free address for pod ``uid``, held (``_release_ip``) until its daemon is stopped:
        locked in ``ip_locks``, so that no other kubelet of this machine hands it out while the
        daemon is still starting (a second daemon on it cannot listen, and the pod's readiness
        probe would be answered by the first: the pod served by another pod's daemon)."""
        self.ip_locks.mkdir(mode=0o700, parents=True, exist_ok=True)
        for host in ipaddress.ip_network(self.ip_network).hosts():
            ip = str(host)
            if ip in self._ips_in_use or ip.endswith(".1"):
                continue
            fd = os.open(self.ip_locks / ip, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # another kubelet's pod (another test run) holds it
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((ip, ENVD_PORT))
                except OSError:
                    os.close(fd)
                    continue  # someone else listens there
            self._ips_in_use[ip] = (uid, fd)
            return ip
        msg = f"no free address in {self.ip_network}"
        raise RuntimeError(msg)

    def _release_ip(self, run: PodRun) -> None:
        """Free ``run``'s address, if it still holds it: a pod is stopped more than once (its
        deletion and the watch's DELETED event), and its address may have gone to another pod
        in between."""
        held = self._ips_in_use.get(run.ip)
        if held is not None and held[0] == run.uid:
            del self._ips_in_use[run.ip]
            os.close(held[1])

    def _command(self, run: PodRun, container: Any, env: dict[str, str]) -> list[str]:
        """The daemon under bubblewrap (the local runtime's pod launcher), or plain if disabled.

        A container ``command`` replaces the daemon (placeholders ``{python} {host} {port}
        {root}``), so a template can describe a pod that never becomes ready.
        """
        bwrap = self.use_bwrap and shutil.which("bwrap") is not None
        workspace = run.workspace or run.root
        root = "/workspace" if bwrap else str(workspace)
        token = env.pop(ACCESS_TOKEN_ENV, None)
        if container.command:
            values = {"python": sys.executable, "host": run.ip, "port": ENVD_PORT, "root": root}
            argv = [part.format(**values) for part in [*container.command, *(container.args or [])]]
        else:
            module = os.environ.get("TORPOR_TEST_ENVD_MODULE") or (
                "services.envd" if real_envd_available() else "tests.support.k8s.standin_envd"
            )
            listen = f"{run.ip}:{ENVD_PORT}"
            argv = [sys.executable, "-m", module, "--listen", listen, "--root", root]
            if token:
                argv += ["--access-token", token]
        if not bwrap:
            return argv
        launch = local_bwrap.PodLaunch(
            bwrap=shutil.which("bwrap") or "bwrap",
            uid=run.uid,
            workload=run.name,
            runtime_root=self.workdir,
            workspace=workspace,
            workdir="/workspace",
            mounts=run.mounts,
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/workspace", **env},
            command=argv,
            code_dirs=local_bwrap.code_dirs(),
            hostname=run.name,
        )
        argv = local_bwrap.bwrap_argv(launch)
        # Unlike the local runtime's pods, ours must die with this kubelet: the inner bwrap
        # (PID 1 of the pod) dies with the outer one, which dies with the kubelet's thread.
        return [argv[0], "--die-with-parent", *argv[1:]]

    async def _start_pod(self, run: PodRun, pod: Any) -> None:
        uid = run.uid
        seen = asyncio.get_running_loop().time()
        try:
            await self._launch(run, pod)
        finally:
            run.starting = False
        if run.terminating:  # deleted while we were starting it
            await self._kill(run)
            return
        self.started_pods.append(uid)
        started = _now()
        await self._patch_status(run, phase="Pending", ready=False, started=started)
        if not await self._wait_healthy(run, timeout=30.0):
            if not run.terminating:  # like restartPolicy Always in CrashLoopBackOff: never ready
                await self._patch_status(run, phase="Running", ready=False, started=started)
            return
        if run.terminating:
            return
        self.daemon_start_seconds.append(asyncio.get_running_loop().time() - seen)
        await self._patch_status(run, phase="Running", ready=True, started=started)
        run.watcher = asyncio.create_task(self._watch_process(run, started))

    async def _launch(self, run: PodRun, pod: Any) -> None:
        """Start the pod's process (``run.proc``), unless it is deleted first."""
        if run.terminating:
            return
        run.root.mkdir(parents=True, exist_ok=True)
        container = next(
            (c for c in pod.spec.containers if c.name == "envd"), pod.spec.containers[0]
        )
        if not await self._mount_volumes(run, pod, container):
            return
        env = {e.name: e.value for e in (container.env or []) if e.value is not None}
        argv = self._command(run, container, env)
        child_env = {**os.environ, **env, "PYTHONPATH": str(REPO_ROOT)}
        log_file = (self.workdir / "pods" / run.uid / "daemon.log").open("ab")
        try:
            run.proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                env=child_env,
                cwd=str(REPO_ROOT),
                start_new_session=True,
                preexec_fn=_die_with_kubelet,
            )
        finally:
            log_file.close()

    async def _mount_volumes(self, run: PodRun, pod: Any, container: Any) -> bool:
        """Resolve the container's volume mounts as a kubelet does: an emptyDir is a folder of
        the pod's (gone with it), a claim is its bound volume's folder (waits until bound, as a
        pod waits for its volumes). False if the pod was deleted meanwhile."""
        sources: dict[str, Path] = {}
        for volume in pod.spec.volumes or []:
            if volume.empty_dir is not None:
                sources[volume.name] = run.root.parent / "volumes" / volume.name
            elif volume.persistent_volume_claim is not None:
                claim = volume.persistent_volume_claim.claim_name
                while (
                    found := await provisioner.bound_path(self._core, run.namespace, claim)
                ) is None:
                    if run.terminating:
                        return False
                    await asyncio.sleep(0.1)
                sources[volume.name] = found
        for mount in container.volume_mounts or []:
            if mount.name not in sources:
                continue
            source = sources[mount.name] / (mount.sub_path or "")
            source.mkdir(parents=True, exist_ok=True)
            if mount.mount_path == "/workspace":
                run.workspace = source
            else:
                run.mounts.append(
                    local_bwrap.Mount(source, mount.mount_path, bool(mount.read_only))
                )
        return not run.terminating

    async def _wait_healthy(self, run: PodRun, *, timeout: float) -> bool:
        """The readiness probe: ``GET /health`` on the daemon answers 2xx."""
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            if run.terminating or run.proc is None or run.proc.returncode is not None:
                return False
            try:
                reader, writer = await asyncio.open_connection(run.ip, ENVD_PORT)
                writer.write(
                    f"GET /health HTTP/1.1\r\nHost: {run.ip}\r\nConnection: close\r\n\r\n".encode()
                )
                await writer.drain()
                status_line = await asyncio.wait_for(reader.readline(), 2)
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
                if status_line.split(b" ")[1:2] and status_line.split(b" ")[1].startswith(b"2"):
                    return True
            except (OSError, TimeoutError):
                pass
            await asyncio.sleep(0.05)
        return False

    async def _watch_process(self, run: PodRun, started: dt.datetime) -> None:
        assert run.proc is not None
        await run.proc.wait()
        if not run.terminating:  # died on its own: no restarts here, the pod just turns unready
            with contextlib.suppress(ApiException):
                await self._patch_status(run, phase="Running", ready=False, started=started)

    async def _patch_status(
        self, run: PodRun, *, phase: str, ready: bool, started: dt.datetime
    ) -> None:
        now = _rfc3339(_now())
        flag = "True" if ready else "False"
        state: dict[str, Any] = (
            {"running": {"startedAt": _rfc3339(started)}}
            if ready
            else {"waiting": {"reason": "ContainerCreating"}}
            if phase == "Pending"
            else {"waiting": {"reason": "CrashLoopBackOff"}}
        )
        body = {
            "status": {
                "phase": phase,
                "hostIP": "127.0.0.1",
                "hostIPs": [{"ip": "127.0.0.1"}],
                "podIP": run.ip,
                "podIPs": [{"ip": run.ip}],
                "startTime": _rfc3339(started),
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                    {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
                    {"type": "Ready", "status": flag, "lastTransitionTime": now},
                ],
                "containerStatuses": [
                    {
                        "name": "envd",
                        "image": "torpor/sandbox-base",
                        "imageID": "",
                        "ready": ready,
                        "started": ready,
                        "restartCount": 0,
                        "state": state,
                    }
                ],
            }
        }
        await self._core.patch_namespaced_pod_status(
            run.name, run.namespace, body, _content_type=STRATEGIC
        )

    async def _terminate(self, run: PodRun) -> None:
        if self.termination_delay > 0:
            await asyncio.sleep(self.termination_delay)
        await self._kill(run)
        options = k8s.V1DeleteOptions.model_validate(
            {"gracePeriodSeconds": 0, "preconditions": {"uid": run.uid}}
        )
        try:
            await self._core.delete_namespaced_pod(
                run.name, run.namespace, grace_period_seconds=0, body=options
            )
        except ApiException as e:
            if e.status not in (404, 409):  # already gone, or a different pod by that name
                raise
        self._pods.pop(run.uid, None)

    async def _kill(self, run: PodRun) -> None:
        """Stop the pod's processes: SIGTERM, then SIGKILL after a grace period."""
        proc = run.proc
        run.terminating = True
        if proc is not None and proc.returncode is None:
            # Both bwraps and the daemon (the inner bwrap is in a session of its own), found by
            # the marks the local runtime's launcher puts on their command lines.
            await procfs.stop_pod(run.uid, runtime_root=self.workdir, grace=5.0)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # a plain (non-bwrap) pod, or leftovers
            await proc.wait()
        if run.watcher is not None:
            run.watcher.cancel()
        if run.ip and not run.starting:  # else its start stops it again, then frees it
            self._release_ip(run)
        if run.root != Path():
            # A container's disk and its emptyDirs die with it; a claim's folder does not.
            shutil.rmtree(run.root, ignore_errors=True)
            shutil.rmtree(run.root.parent / "volumes", ignore_errors=True)


def _tail(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-20:]
    except OSError:
        return []


def _die_with_kubelet() -> None:
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
