"""The sandboxes' data claims (``persist: layer``): one PersistentVolumeClaim per sandbox, owned
by its ReplicaSet, never anyone else's object of that name."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog
from kubernetes.aio import client as k8s

from shared.errors import Conflict, NotFound, RuntimeFailure
from shared.ports.workloads import LABEL_MANAGED_BY, LABEL_SANDBOX_ID, MANAGED_BY
from shared.runtime.kubernetes.errors import api_errors
from shared.runtime.kubernetes.namespace import Namespace, json_or_raise
from shared.runtime.kubernetes.objects import claim_body, claim_is_ours, claim_name

log = structlog.get_logger()


class VolumeClaims(Namespace):
    async def _ensure_claim(
        self, name: str, rs_uid: str, size: str, *, timeout: float = 60.0
    ) -> None:
        """Create the sandbox's data claim unless its live one exists. A claim of that name
        that is not this ReplicaSet's (a deleted sandbox's with the same id, still terminating
        or left behind, or anyone else's object) is never mounted: a stale torpor claim is
        deleted and replaced, a foreign one is an error."""
        claim = claim_name(name)
        body = claim_body(
            name,
            rs_uid=rs_uid,
            size=size,
            storage_class=self._storage_class,
        )
        what = f"create PersistentVolumeClaim {self._ns}/{claim}"
        try:
            async with asyncio.timeout(timeout):
                while True:
                    try:
                        with api_errors(what):
                            await self._core.create_namespaced_persistent_volume_claim(
                                self._ns, k8s.V1PersistentVolumeClaim.model_validate(body)
                            )
                        log.info("k8s_claim_created", name=name, claim=claim)
                        return
                    except Conflict:
                        pass
                    existing = await self._read_claim(claim)
                    if existing is None:
                        continue  # deleted meanwhile: create again
                    if claim_is_ours(existing, name, rs_uid):
                        return
                    labels = (existing.get("metadata") or {}).get("labels") or {}
                    if labels.get(LABEL_SANDBOX_ID) != name:
                        msg = f"{what}: a claim of that name exists and is not torpor's"
                        raise Conflict(msg)
                    if (existing.get("metadata") or {}).get("deletionTimestamp") is None:
                        log.info("k8s_stale_claim_deleted", name=name, claim=claim)
                        with contextlib.suppress(NotFound), api_errors(what):
                            await self._core.delete_namespaced_persistent_volume_claim(
                                claim, self._ns
                            )
                    await asyncio.sleep(0.2)  # until the stale one is gone
        except TimeoutError:
            msg = f"{what}: a stale claim of that name did not go away within {timeout:g}s"
            raise RuntimeFailure(msg) from None

    async def _delete_claim(self, name: str) -> None:
        """Delete the sandbox's claim, if the object of that name is torpor's claim for this
        sandbox (by its labels; precondition on its uid): never anyone else's."""
        claim = claim_name(name)
        found = await self._read_claim(claim)
        if found is None:
            return
        meta = found.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(LABEL_SANDBOX_ID) != name or labels.get(LABEL_MANAGED_BY) != MANAGED_BY:
            log.warning("k8s_foreign_claim_left_alone", name=name, claim=claim)
            return
        options = k8s.V1DeleteOptions.model_validate({"preconditions": {"uid": meta.get("uid")}})
        try:
            with api_errors(f"delete PersistentVolumeClaim {self._ns}/{claim}"):
                await self._core.delete_namespaced_persistent_volume_claim(
                    claim, self._ns, body=options
                )
        except (NotFound, Conflict):
            pass  # gone, or replaced meanwhile by a new sandbox's claim
        else:
            log.info("k8s_claim_deleted", name=name, claim=claim)

    async def _read_claim(self, claim: str) -> dict[str, Any] | None:
        try:
            with api_errors(f"read PersistentVolumeClaim {self._ns}/{claim}"):
                resp = await self._core.read_namespaced_persistent_volume_claim_without_preload_content(  # noqa: E501
                    claim, self._ns
                )
                try:
                    return await json_or_raise(resp)
                finally:
                    resp.release()
        except NotFound:
            return None
