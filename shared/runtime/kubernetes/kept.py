"""Kept files of ``torpor.dev/persist: store`` sandboxes: between a pod's daemon
(``/kept-files``, ``services.envd.archive``) and the kept-files store (``shared.ports.kept_files``).

Why a store and not the sandbox's claim: a running pod's volumes cannot change, so a warm pool
pod can never mount a sandbox's claim; the daemon can take a tar of its files instead. The data
volume stays the template's emptyDir. At pause the snapshotter (``Runtime.keep_files``) has the
daemon export ``/home/user`` and ``/workspace`` into the store (a temporary file on the way, at
most the template's disk size), the pod's processes stopped for it and held stopped after it
(``hold``) until the pod stops, so nothing they write after the copy is lost unseen; at every
``wait_ready`` the runtime imports the sandbox's object, if it has one, into the pod before it
returns it, so nothing is replayed before the files are in.
The daemon imports only once and only before a process was started through its API; a repeat
(a redelivered resume on the same pod) is its 409, which is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import tempfile
import time
from collections.abc import AsyncIterator
from typing import IO

import httpx
import structlog

from shared.errors import RuntimeFailure, SnapshotTooLarge
from shared.ports.kept_files import KeptFiles, KeptKey
from shared.ports.workloads import Endpoint

log = structlog.get_logger()

CHUNK = 256 * 1024
MAX_HOLD_SECONDS = 600  # the daemon's bound (services.envd.archive)
EMPTY_TAR = bytes(1024)  # the end-of-archive marker alone


class KeptFilesMover:
    def __init__(self, store: KeptFiles, *, timeout: float = 300.0) -> None:
        self._store = store
        self._http = httpx.AsyncClient(timeout=timeout, trust_env=False)

    async def export(
        self, endpoint: Endpoint, token: str, key: KeptKey, *, limit: int, hold: float = 0
    ) -> int:
        """The pod's files into the store as ``key`` (replacing the older copy only once all of
        the new one is stored); the bytes stored. The daemon stops the pod's processes for the
        export and, with ``hold``, that many seconds after it; if anything fails after the
        daemon's part, they are continued here (best effort: the hold runs out anyway)."""
        try:
            return await self._export(endpoint, token, key, limit=limit, hold=hold_seconds(hold))
        except BaseException:
            if hold > 0:
                with contextlib.suppress(RuntimeFailure):
                    await self.thaw(endpoint, token)
            raise

    async def thaw(self, endpoint: Endpoint, token: str) -> int:
        """Continue the processes a held export left stopped; how many were."""
        try:
            response = await self._http.post(
                f"{endpoint.base_url}/kept-files/thaw", headers={"X-Access-Token": token}
            )
        except httpx.HTTPError as e:
            msg = f"the pod's daemon could not be asked to thaw: {type(e).__name__}: {e}"
            raise RuntimeFailure(msg[:500]) from e
        if response.status_code != 200:
            msg = f"the pod's daemon refused the thaw ({response.status_code}): {response.text}"
            raise RuntimeFailure(msg[:500])
        continued = int(response.json().get("continued", 0))
        log.info("k8s_kept_files_thawed", pod_uid=endpoint.pod_uid, continued=continued)
        return continued

    async def _export(
        self, endpoint: Endpoint, token: str, key: KeptKey, *, limit: int, hold: int
    ) -> int:
        with tempfile.TemporaryFile() as fh:
            size = 0
            try:
                async with self._http.stream(
                    "GET",
                    f"{endpoint.base_url}/kept-files",
                    params={"hold": str(hold)},
                    headers={"X-Access-Token": token},
                ) as response:
                    if response.status_code != 200:
                        body = (await response.aread()).decode(errors="replace")[:300]
                        code = response.status_code
                        msg = f"the pod's daemon refused the export ({code}): {body}"
                        raise RuntimeFailure(msg)
                    async for chunk in response.aiter_bytes(CHUNK):
                        size += len(chunk)
                        if size > limit:
                            msg = f"kept files of {key.ident} are over the disk size ({limit} B)"
                            raise SnapshotTooLarge(msg)
                        await asyncio.to_thread(fh.write, chunk)
            except httpx.HTTPError as e:
                msg = f"export of {key.ident}'s files failed: {type(e).__name__}: {e}"[:500]
                raise RuntimeFailure(msg) from e
            await asyncio.to_thread(fh.seek, 0)
            stored = await self._store.put(key, fh, limit=limit)
        log.info("k8s_kept_files_exported", name=key.ident, bytes=stored, hold=hold)
        return stored

    async def restore(self, endpoint: Endpoint, token: str, key: KeptKey, *, limit: int) -> bool:
        """The stored object into the pod; False when there is none. A pod that imported
        already (or started a process: the control plane imports before it does) is done."""
        started = time.monotonic()
        with tempfile.TemporaryFile() as fh:
            if not await self._store.get(key, fh):
                return False
            fetched = time.monotonic()
            await asyncio.to_thread(fh.seek, 0)
            try:
                response = await self._http.post(
                    f"{endpoint.base_url}/kept-files",
                    params={"limit": str(limit)},
                    content=_chunks(fh),
                    headers={"X-Access-Token": token, "Content-Type": "application/x-tar"},
                )
            except httpx.HTTPError as e:
                msg = f"import of {key.ident}'s files failed: {type(e).__name__}: {e}"[:500]
                raise RuntimeFailure(msg) from e
        if response.status_code == 409:
            log.info("k8s_kept_files_already_in", name=key.ident, pod_uid=endpoint.pod_uid)
            return True
        if response.status_code != 200:
            msg = f"the pod refused {key.ident}'s files ({response.status_code}): {response.text}"
            raise RuntimeFailure(msg[:500])
        log.info(
            "k8s_kept_files_restored",
            name=key.ident,
            pod_uid=endpoint.pod_uid,
            fetch_ms=round((fetched - started) * 1000),
            import_ms=round((time.monotonic() - fetched) * 1000),
        )
        return True

    async def copy(self, source: KeptKey, target: KeptKey, *, limit: int) -> int | None:
        """The stored ``source`` as ``target`` too; None when there is no ``source``."""
        with tempfile.TemporaryFile() as fh:
            if not await self._store.get(source, fh):
                return None
            await asyncio.to_thread(fh.seek, 0)
            return await self._store.put(target, fh, limit=limit)

    async def put_empty(self, key: KeptKey) -> int:
        """An archive with no files (what a sandbox that keeps nothing has)."""
        with tempfile.TemporaryFile() as fh:
            await asyncio.to_thread(fh.write, EMPTY_TAR)
            await asyncio.to_thread(fh.seek, 0)
            return await self._store.put(key, fh, limit=len(EMPTY_TAR))

    async def forget(self, key: KeptKey) -> None:
        await self._store.delete(key)

    async def close(self) -> None:
        await self._http.aclose()
        await self._store.close()


def hold_seconds(hold: float) -> int:
    """Whole seconds for the daemon (``?hold=``, 0 to ``MAX_HOLD_SECONDS``), rounded up."""
    if not 0 <= hold <= MAX_HOLD_SECONDS:
        msg = f"hold must be from 0 to {MAX_HOLD_SECONDS} seconds, not {hold}"
        raise ValueError(msg)
    return math.ceil(hold)


async def _chunks(fh: IO[bytes]) -> AsyncIterator[bytes]:
    while chunk := await asyncio.to_thread(fh.read, CHUNK):
        yield chunk
