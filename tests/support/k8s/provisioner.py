"""A tiny volume provisioner for the test rigs (test code only, not torpor's): binds each torpor
PersistentVolumeClaim to a hostPath PersistentVolume on a directory of its own under the rig's
data dir, and deletes the volume and its directory once the claim is gone.

The controller manager's PV binder does the binding (the PV is pre-bound through ``claimRef``),
so claims go through the real ``Pending`` → ``Bound`` cycle. Both the test kubelet (a task in
its loop) and the real node (a thread of its own) run it.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
from pathlib import Path
from typing import Any

import structlog
from kubernetes.aio import client as k8s
from kubernetes.aio import config as k8s_config
from kubernetes.aio import watch as k8s_watch
from kubernetes.aio.client.exceptions import ApiException

from shared.ports.workloads import LABEL_MANAGED_BY, MANAGED_BY

log = structlog.get_logger()
SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY}"


def volume_name(claim_uid: str) -> str:
    return f"torpor-test-{claim_uid}"


async def provision(core: k8s.CoreV1Api, volumes: Path, selector: str = SELECTOR) -> None:
    """Follow the claims ``selector`` picks (torpor's sandbox claims by default) until
    cancelled (relisting when a watch ends)."""
    volumes.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            listed = await core.list_persistent_volume_claim_for_all_namespaces(
                label_selector=selector
            )
            for claim in listed.items:
                await _on_claim(core, volumes, "ADDED", claim)
            version = listed.metadata.resource_version if listed.metadata else None
            async with k8s_watch.Watch() as w:  # type: ignore[no-untyped-call]
                async for event in w.stream(
                    core.list_persistent_volume_claim_for_all_namespaces,
                    label_selector=selector,
                    resource_version=version,
                    timeout_seconds=300,
                ):
                    await _on_claim(core, volumes, event["type"], event["object"])
        except asyncio.CancelledError:
            raise
        except Exception as e:  # 410 Gone, a dropped watch: relist
            log.info("test_provisioner.rewatch", error=repr(e))
            await asyncio.sleep(0.5)


async def _on_claim(core: k8s.CoreV1Api, volumes: Path, kind: str, claim: Any) -> None:
    meta, spec = claim.metadata, claim.spec
    if meta is None or spec is None or meta.uid is None:
        return
    name = volume_name(meta.uid)
    folder = volumes / meta.uid
    if kind == "DELETED":
        with contextlib.suppress(ApiException):
            await core.delete_persistent_volume(name)
        shutil.rmtree(folder, ignore_errors=True)
        return
    if spec.volume_name or meta.deletion_timestamp is not None:
        return
    # World-writable like local-path-provisioner's folders: the sandbox runs as uid 1000 on the
    # real node, and a hostPath volume gets no fsGroup ownership.
    folder.mkdir(mode=0o777, exist_ok=True)
    folder.chmod(0o777)
    size = ((spec.resources.requests if spec.resources else None) or {}).get("storage", "1Gi")
    body = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {LABEL_MANAGED_BY: "torpor-test-provisioner"}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": spec.access_modes or ["ReadWriteOnce"],
            "storageClassName": spec.storage_class_name or "",
            "persistentVolumeReclaimPolicy": "Retain",  # this provisioner deletes it
            "hostPath": {"path": str(folder), "type": "Directory"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta.namespace,
                "name": meta.name,
                "uid": meta.uid,
            },
        },
    }
    try:
        await core.create_persistent_volume(k8s.V1PersistentVolume.model_validate(body))
        log.info("test_provisioner.volume_created", claim=meta.name, path=str(folder))
    except ApiException as e:
        if e.status != 409:
            raise


async def bound_path(core: k8s.CoreV1Api, namespace: str, claim: str) -> Path | None:
    """The host folder of a bound claim's volume, or None while it is not bound."""
    try:
        pvc = await core.read_namespaced_persistent_volume_claim(claim, namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    if pvc.status is None or pvc.status.phase != "Bound" or pvc.spec is None:
        return None
    if not pvc.spec.volume_name:
        return None
    pv = await core.read_persistent_volume(pvc.spec.volume_name)
    if pv.spec is None or pv.spec.host_path is None:
        return None
    return Path(pv.spec.host_path.path)


class TestProvisioner:
    """``provision`` in a thread of its own (for the real node's control plane)."""

    __test__ = False

    def __init__(self, kubeconfig: Path, volumes: Path, selector: str = SELECTOR) -> None:
        self._kubeconfig, self._volumes, self._selector = kubeconfig, volumes, selector
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()

    def start(self) -> TestProvisioner:
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)
        self._thread.start()
        self._started.wait(30)
        return self

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        api = await k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self._kubeconfig)
        )
        try:
            self._task = asyncio.create_task(
                provision(k8s.CoreV1Api(api), self._volumes, self._selector)
            )
            self._started.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        finally:
            await api.close()

    def stop(self) -> None:
        if self._loop is not None and self._task is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._task.cancel)
        if self._thread is not None:
            self._thread.join(timeout=30)
