"""One local runtime instance: its configuration, its start (bubblewrap, the root filesystem, the
pod network, the NATS bucket of workload records, the reconciler) and its close.

``LocalRuntime`` (``.workloads``) is this plus its parts: ``.waiting`` (ready and stopped) and
``.file_keeping`` (kept files and the files of stored snapshots).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import nats
import structlog
from nats.aio.client import Client
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

from shared.bus.topology import KV_WORKLOADS, workloads_bucket
from shared.errors import RuntimeFailure, Unavailable
from shared.models.template_records import BUILT_TEMPLATES_DIR
from shared.redaction import redact_text
from shared.runtime.local import (
    bwrap,
    bytecode,
    checkpoint,
    daemon_python,
    limits,
    podlog,
    volume_fs,
)
from shared.runtime.local import rootfs as rootfs_location
from shared.runtime.local.addresses import AddressPool
from shared.runtime.local.launcher import PodLauncher
from shared.runtime.local.memory import MemoryPauses
from shared.runtime.local.network import PodNetwork
from shared.runtime.local.reconciler import Reconciler
from shared.runtime.local.records import WorkloadStore
from shared.runtime.local.spawning import STAGE_DIR
from shared.runtime.local.userns import IdRangePool
from shared.runtime.templates import template_dirs

log = structlog.get_logger()

DEFAULT_BUCKET = KV_WORKLOADS


class RuntimeInstance:
    """The state, start and close of ``LocalRuntime``."""

    def __init__(
        self,
        *,
        nats_url: str,
        data_dir: Path,
        nats_options: Mapping[str, Any] | None = None,
        templates_dir: Path | None = None,
        bucket: str = DEFAULT_BUCKET,
        bwrap: str = "bwrap",
        stop_grace: float = 2.0,
        supervise: bool = True,
        stop_pods_on_close: bool = True,
        pod_cidr: str = "auto",
        poll_interval: float = 1.0,
        rootfs: Path | None = None,
        pools: Mapping[str, int] | None = None,
        pool_claim_timeout: float = 30.0,
        pod_log_bytes: int = podlog.DEFAULT_CAP,
    ) -> None:
        self._pod_log_bytes = pod_log_bytes
        self._nats_url = nats_url
        self._nats_options = dict(nats_options or {})  # credentials, inbox prefix
        self._data_dir = data_dir.resolve()
        self._template_dirs = template_dirs(
            templates_dir, built=self._data_dir / BUILT_TEMPLATES_DIR
        )
        self._bucket = bucket
        self._bwrap = bwrap
        self._stop_grace = stop_grace
        self._supervise = supervise
        self._stop_pods_on_close = stop_pods_on_close
        self._network = PodNetwork(self._data_dir, pod_cidr=pod_cidr)  # ConfigError if bad
        self._poll_interval = poll_interval
        self._rootfs = rootfs
        # Warm pods per template (see .pools), kept by a supervising runtime.
        self._pools = {t: n for t, n in (pools or {}).items() if n > 0} if supervise else {}
        self._pool_claim_timeout = pool_claim_timeout
        self._nc: Client | None = None
        self._store_: WorkloadStore | None = None
        self._addresses_: AddressPool | None = None
        self._id_ranges_: IdRangePool | None = None
        self._reconciler_: Reconciler | None = None
        self._launcher: PodLauncher | None = None
        self._closing = False
        # What `criu check` said at start-up (see .checkpoint and docs/memory-pause.md).
        self.checkpoints = checkpoint.Capability(False, "", "not probed yet")

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self) -> Self:
        await bwrap.check_bwrap(self._bwrap)
        rootfs = await asyncio.to_thread(rootfs_location.locate, self._rootfs)
        await self._network.open()
        (self._data_dir / "pods").mkdir(parents=True, exist_ok=True)
        (self._data_dir / "logs").mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(volume_fs.mount, self._data_dir)
        await asyncio.to_thread(STAGE_DIR.mkdir, mode=0o755, exist_ok=True)
        cgroups = await asyncio.to_thread(
            limits.Cgroups.detect, limits.instance_name(self._data_dir)
        )
        daemon = await asyncio.to_thread(daemon_python.ensure, self._data_dir)
        pycache = await asyncio.to_thread(bytecode.cache_dir, daemon)
        await bytecode.ensure(daemon, pycache)
        self._launcher = PodLauncher(
            data_dir=self._data_dir,
            template_dirs=self._template_dirs,
            bwrap_path=self._bwrap,
            daemon=daemon,
            stop_grace=self._stop_grace,
            pycache=pycache,
            cgroups=cgroups,
            rootfs=rootfs,
            log_bytes=self._pod_log_bytes,
        )
        try:
            self._nc = await nats.connect(
                self._nats_url, max_reconnect_attempts=-1, **self._nats_options
            )
        except Exception as e:  # nats-py raises several unrelated types on connect failure
            msg = f"cannot connect to NATS at {redact_text(self._nats_url)}: {e}"
            raise Unavailable(msg) from e
        kv = await self._bucket_kv()
        self._store_ = WorkloadStore(kv)
        self._addresses_ = AddressPool(kv, network=self._network)
        self._id_ranges_ = IdRangePool(kv, instance=str(self._data_dir))
        self.checkpoints = await checkpoint.probe(checkpoint.default_criu())
        criu = checkpoint.default_criu() if self.checkpoints.available else None
        memory = MemoryPauses(
            launcher=self._launcher,
            template_dirs=self._template_dirs,
            checkpointer=checkpoint.Criu(criu) if criu is not None else None,
            unavailable=self.checkpoints.reason,
        )
        self._reconciler_ = Reconciler(
            store=self._store_,
            addresses=self._addresses_,
            id_ranges=self._id_ranges_,
            launcher=self._launcher,
            network=self._network,
            poll_interval=self._poll_interval,
            pools=self._pools,
            template_dirs=self._template_dirs,
            pool_claim_timeout=self._pool_claim_timeout,
            memory=memory,
        )
        if self._supervise:
            await self._reconciler_.reconcile_all(stray_sweep=True)
            self._reconciler_.start_monitor()
        log.info(
            "runtime_local_started",
            data_dir=str(self._data_dir),
            cgroups=bool(cgroups),
            criu=self.checkpoints.version or None,
            # Without CRIU pauses keep files and resumes replay processes (docs/memory-pause.md).
            criu_unavailable=self.checkpoints.reason or None,
        )
        return self

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._reconciler_ is None:
            if self._nc is not None:
                await self._nc.close()
            return
        await self._reconciler_.close()
        try:
            if self._stop_pods_on_close:
                await self._reconciler_.stop_everything()
        finally:
            if self._stop_pods_on_close:  # even when NATS is gone: never leave orphans
                await self._reconciler_.stop_every_pod()
                await asyncio.to_thread(volume_fs.unmount, self._data_dir)
                await self._network.release()
                if self._launcher is not None:
                    await self._launcher.close()
            if self._nc is not None:
                await self._nc.close()

    async def _bucket_kv(self) -> KeyValue:
        assert self._nc is not None
        js = self._nc.jetstream()
        try:
            return await js.key_value(self._bucket)
        except BucketNotFoundError:
            return await js.create_key_value(replace(workloads_bucket(), bucket=self._bucket))

    @property
    def _store(self) -> WorkloadStore:
        if self._store_ is None:
            msg = "LocalRuntime used before start()"
            raise RuntimeFailure(msg)
        return self._store_

    @property
    def _addresses(self) -> AddressPool:
        if self._addresses_ is None:
            msg = "LocalRuntime used before start()"
            raise RuntimeFailure(msg)
        return self._addresses_

    @property
    def _reconciler(self) -> Reconciler:
        if self._reconciler_ is None:
            msg = "LocalRuntime used before start()"
            raise RuntimeFailure(msg)
        return self._reconciler_
