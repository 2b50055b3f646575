"""Files of sandboxes and snapshots through the kept-files store (see ``.kept``): the kept files
of ``persist: store`` sandboxes while paused, and the files of stored snapshots."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import structlog

from shared.errors import NotFound, RuntimeFailure, Unsupported
from shared.ports.kept_files import KeptKey
from shared.ports.workloads import Endpoint
from shared.runtime.kubernetes.kept import KeptFilesMover
from shared.runtime.kubernetes.namespace import Namespace
from shared.runtime.kubernetes.objects import (
    ACCESS_TOKEN_ENV,
    claim_size,
    persist_mode,
    ready_endpoint,
    sandbox_selector,
)
from shared.runtime.kubernetes.pools import sandbox_env
from shared.runtime.templates import parse_bytes

log = structlog.get_logger()

# Refused openly: a snapshot without its files would start sandboxes that silently lack them.
FILES_UNSUPPORTED = "snapshots with files need the kept-files store; this runtime has none"


class FileKeeping(Namespace):
    # ---- kept files of persist: store ---------------------------------------------------

    async def keep_files(self, name: str, *, hold: float = 0) -> int:
        found = await self._store_parts(name)
        if found is None:
            return 0  # not persist: store: a claim keeps them, or nothing is kept
        kept, token, limit = found
        endpoint = await self._running_endpoint(name)
        if endpoint is None:
            msg = f"{self._ns}/{name} has no running pod to take its kept files from"
            raise RuntimeFailure(msg)
        return await kept.export(endpoint, token, KeptKey.sandbox(name), limit=limit, hold=hold)

    async def thaw_files(self, name: str) -> None:
        found = await self._store_parts(name)
        endpoint = None if found is None else await self._running_endpoint(name)
        if found is not None and endpoint is not None:
            kept, token, _ = found
            await kept.thaw(endpoint, token)

    async def _running_endpoint(self, name: str) -> Endpoint | None:
        pods, _ = await self._pods(sandbox_selector(name))
        rs = await self._read(name)
        return ready_endpoint(pods, rs.metadata.uid if rs and rs.metadata else None)

    async def _restore_kept(self, name: str, endpoint: Endpoint) -> None:
        early = self._imports.pop(endpoint.pod_uid, None)
        for uid in [u for u, task in self._imports.items() if task.done()]:
            del self._imports[uid]  # pods claimed but never served (a failed resume)
        if early is not None:
            try:
                await early
                return
            except Exception as e:  # imported as usual below (a repeat is the daemon's 409)
                log.warning("k8s_kept_files_early_import_failed", name=name, error=str(e)[:300])
        found = await self._store_parts(name)
        if found is not None:
            kept, token, limit = found
            await kept.restore(endpoint, token, KeptKey.sandbox(name), limit=limit)

    def _import_early(
        self, name: str, endpoint: Endpoint, token: str, pod_template: dict[str, Any]
    ) -> None:
        """A resume's warm pod (taken, its daemon bound to the sandbox: ``token`` is its) gets
        the sandbox's kept files from now on, while it is scaled, labelled and adopted; its
        ``wait_ready`` awaits this import instead of starting one, so still nothing is replayed
        before the files are in. ``pod_template``: the template the pod was made from."""
        if self._kept is None or persist_mode(pod_template) != "store":
            return
        limit = parse_bytes(claim_size(pod_template))
        self._imports[endpoint.pod_uid] = asyncio.create_task(
            self._kept.restore(endpoint, token, KeptKey.sandbox(name), limit=limit)
        )

    async def _forget_import(self, pod_uid: str) -> None:
        """The early import into a pod that will not be served (it went): stopped."""
        task = self._imports.pop(pod_uid, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _store_parts(self, name: str) -> tuple[KeptFilesMover, str, int] | None:
        """For a ``persist: store`` workload: the mover, its daemon's token and its disk size;
        None for any other. ``Unsupported`` without a kept-files store."""
        pod_template, token, limit = await self._kept_parts(name)
        if persist_mode(pod_template) != "store":
            return None
        if self._kept is None:
            msg = f"template of {name} keeps files in a store (persist: store): none configured"
            raise Unsupported(msg)
        return self._kept, token, limit

    async def _kept_parts(self, name: str) -> tuple[dict[str, Any], str, int]:
        """The workload's pod template, its daemon's token and its disk size."""
        rs = await self._read_raw(name)
        pod_template: dict[str, Any] = (rs.get("spec") or {}).get("template") or {}
        env = sandbox_env(pod_template, json.dumps([ACCESS_TOKEN_ENV]))
        token = env.get(ACCESS_TOKEN_ENV, "")
        return pod_template, token, parse_bytes(claim_size(pod_template))

    # ---- files of stored snapshots ------------------------------------------------------

    # Through the kept-files store too (see .kept): a running pod's daemon exports them (any
    # persist mode), a paused `store` sandbox's object is copied; a sandbox made from the
    # snapshot (a `store` template) gets the copy as its own object, imported by its first pod.

    async def save_files(self, name: str, snapshot_id: str) -> int:
        if self._kept is None:
            raise Unsupported(FILES_UNSUPPORTED)
        pod_template, token, limit = await self._kept_parts(name)
        key = KeptKey.snapshot(snapshot_id)
        endpoint = await self._running_endpoint(name)
        if endpoint is not None:  # stopped for the export only: the sandbox runs on (hold 0)
            return await self._kept.export(endpoint, token, key, limit=limit)
        mode = persist_mode(pod_template)
        if mode == "store":
            copied = await self._kept.copy(KeptKey.sandbox(name), key, limit=limit)
            return copied if copied is not None else await self._kept.put_empty(key)
        if mode == "none":
            return await self._kept.put_empty(key)  # a paused persist: none keeps nothing
        msg = (
            f"{name} is paused and its files are on its claim (persist: layer), which no pod "
            "reads: snapshot it while it runs, or use a template with persist: store"
        )
        raise Unsupported(msg)

    async def restore_files(self, snapshot_id: str, name: str) -> None:
        if self._kept is None:
            raise Unsupported(FILES_UNSUPPORTED)
        pod_template, _, limit = await self._kept_parts(name)
        if persist_mode(pod_template) != "store":
            msg = (
                "on Kubernetes a sandbox gets a snapshot's files only with a template of "
                "persist: store (its first pod imports them)"
            )
            raise Unsupported(msg)
        copied = await self._kept.copy(
            KeptKey.snapshot(snapshot_id), KeptKey.sandbox(name), limit=limit
        )
        if copied is None:
            raise NotFound(f"snapshot {snapshot_id} has no files")

    async def delete_snapshot_files(self, snapshot_id: str) -> None:
        if self._kept is not None:
            await self._kept.forget(KeptKey.snapshot(snapshot_id))
