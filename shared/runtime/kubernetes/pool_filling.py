"""Keeping the warm pools (see ``.pools``) filled: the scaler's runtime refills each configured
template's pool, drains pods of an older template version, and deletes claimed pods whose
claimer died or that never became ready."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from typing import Any

import structlog
from kubernetes.aio import client as k8s

from shared.errors import ConfigError, NotFound
from shared.ports.workloads import LABEL_MANAGED_BY, MANAGED_BY
from shared.runtime.kubernetes.errors import api_errors
from shared.runtime.kubernetes.namespace import Namespace
from shared.runtime.kubernetes.objects import is_ready, is_terminating, never_started, selector
from shared.runtime.kubernetes.pools import (
    ANNOTATION_BOUND,
    ANNOTATION_CLAIMED,
    ANNOTATION_CLAIMED_AT,
    LABEL_POOL_VERSION,
    claimable,
    pool_pod_body,
    pool_selector,
    poolable,
    template_version,
)

log = structlog.get_logger()


class PoolFilling(Namespace):
    def start_pools(
        self, *, interval: float = 1.0, claim_timeout: float = 60.0, start_timeout: float = 300.0
    ) -> None:
        """Keep the configured pools filled in the background (the scaler's runtime only)."""
        if self._pools and self._pool_task is None:
            for template in self._pools:
                with contextlib.suppress(NotFound):
                    if not poolable(self._templates.get(template)):
                        log.warning("k8s_pool_not_served", template=template)
            self._pool_task = asyncio.create_task(
                self._keep_pools(interval, claim_timeout, start_timeout)
            )

    async def warm_pods(self, template: str) -> int:
        """Pool pods of ``template`` (as it is now) ready to be claimed now."""
        pooled = await self._pooled(template)
        if pooled is None:
            return 0
        version = pooled[0]
        pods, _ = await self._pods(selector(pool_selector(template, version)))
        return sum(1 for p in pods if claimable(p, template, version))

    async def _pooled(self, template: str) -> tuple[str, dict[str, Any]] | None:
        """The version pool pods of ``template`` must have now, and its pod template; None: it
        is not pooled (gone, unreadable, or not poolable any more)."""
        try:
            pod_template = await self.pod_template(template)
        except (NotFound, ConfigError):
            return None
        return (template_version(pod_template), pod_template) if poolable(pod_template) else None

    async def _keep_pools(
        self, interval: float, claim_timeout: float, start_timeout: float
    ) -> None:
        while True:
            try:
                await self._refill(claim_timeout, start_timeout)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("k8s_pool_refill_failed")
            await asyncio.sleep(interval)

    async def _refill(self, claim_timeout: float, start_timeout: float) -> None:
        for template, size in self._pools.items():
            pooled = await self._pooled(template)
            version = pooled[0] if pooled is not None else None
            pods, _ = await self._pods(selector(pool_selector(template)))
            live = []
            for pod in (p for p in pods if not is_terminating(p)):
                labels = pod["metadata"].get("labels") or {}
                if version is not None and labels.get(LABEL_POOL_VERSION) == version:
                    live.append(pod)
                    continue
                # Made from an older template (or one no longer pooled): it drains, unclaimed.
                log.info("k8s_pool_stale", template=template, pod=pod["metadata"]["name"])
                await self._delete_pod(pod, as_seen=True)
            if pooled is None:
                continue
            pod_template = pooled[1]
            waiting = [p for p in live if not is_ready(p)]
            # One pod starting at a time: one that never starts (failed, or stuck pending: an
            # image that never pulls, a node that never runs it) must not stop the refill.
            for stuck in [p for p in waiting if never_started(p, start_timeout)]:
                log.warning(
                    "k8s_pool_pod_not_started", template=template, pod=stuck["metadata"]["name"]
                )
                await self._delete_pod(stuck, as_seen=True)
                live.remove(stuck)
                waiting.remove(stuck)
            if len(live) < size and not waiting:
                body = pool_pod_body(template, pod_template, len(live), secrets.token_hex(24))
                body["metadata"]["name"] += f"-{secrets.token_hex(3)}"
                with api_errors(f"create pool pod in {self._ns}"):
                    await self._core.create_namespaced_pod(self._ns, k8s.V1Pod.model_validate(body))
                log.info("k8s_pool_filling", template=template, pod=body["metadata"]["name"])
            # Two scalers filled one slot: the extras go (both pick the same ones).
            for extra in sorted(live, key=lambda p: p["metadata"]["name"])[size:]:
                await self._delete_pod(extra, as_seen=True)
        # A claimed pod never bound, or never adopted, after the claim timeout: its claimer died.
        claimed, _ = await self._pods(selector({LABEL_MANAGED_BY: MANAGED_BY}))
        now = time.time()
        for pod in claimed:
            annotations = pod["metadata"].get("annotations") or {}
            if ANNOTATION_CLAIMED not in annotations or is_terminating(pod):
                continue
            adopted = bool(pod["metadata"].get("ownerReferences"))
            if adopted and ANNOTATION_BOUND in annotations:
                continue
            since = float(annotations.get(ANNOTATION_CLAIMED_AT, "0") or 0)
            if now - since > claim_timeout:
                log.warning("k8s_pool_claim_abandoned", pod=pod["metadata"]["name"])
                await self._delete_pod(pod, as_seen=True)
