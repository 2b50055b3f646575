"""Claiming a warm pool pod (see ``.pools``) for a sandbox, at its create or its resume: one
winner per pod, its daemon bound to the sandbox, then adopted by the sandbox's ReplicaSet."""

from __future__ import annotations

import builtins
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import structlog

from shared.errors import Conflict, NotFound, RuntimeFailure
from shared.ports.workloads import ENVD_PORT
from shared.runtime.kubernetes.errors import api_errors
from shared.runtime.kubernetes.namespace import (
    MERGE_PATCH,
    STRATEGIC_PATCH,
    json_or_raise,
    lost_race,
)
from shared.runtime.kubernetes.objects import (
    ACCESS_TOKEN_ENV,
    ANNOTATION_SANDBOX_ENV,
    LABEL_TEMPLATE,
    Pod,
    is_terminating,
    owner_reference,
    sandbox_selector,
    selector,
)
from shared.runtime.kubernetes.pool_filling import PoolFilling
from shared.runtime.kubernetes.pools import (
    ANNOTATION_BOUND,
    ANNOTATION_CLAIMED_AT,
    ANNOTATION_SECRET,
    UNGATE_PATCH,
    claim_patch,
    claimable,
    is_warm_gated,
    pool_selector,
    poolable,
    sandbox_env,
)
from shared.spans import Spans

log = structlog.get_logger()


@dataclass(frozen=True)
class WarmResume:
    """What a resume's claim needs: the ReplicaSet as read (the re-render patches it at that
    version), the ready pool pods as listed, and what binds and adopts the pod."""

    rs: dict[str, Any]
    pod_template: dict[str, Any]  # the template as it is now: the pool pods' version
    pods: builtins.list[Pod]
    template: str
    version: str
    labels: dict[str, str]
    token: str
    env: dict[str, str]


class PoolClaiming(PoolFilling):
    def _serves(self, template_name: str, pod_template: Mapping[str, Any]) -> bool:
        return template_name in self._pools and poolable(pod_template)

    async def _warm_resume(self, name: str) -> WarmResume | None:
        """What a claim for stopped workload ``name`` needs, or None when it takes no warm pod."""
        with api_errors(f"read ReplicaSet {self._ns}/{name}"):
            resp = await self._apps.read_namespaced_replica_set_without_preload_content(
                name, self._ns
            )
            try:
                rs = await json_or_raise(resp)
            finally:
                resp.release()
        meta, spec = rs.get("metadata") or {}, rs.get("spec") or {}
        template = (meta.get("labels") or {}).get(LABEL_TEMPLATE)
        pod_template = spec.get("template") or {}
        if spec.get("replicas") or template is None or template not in self._pools:
            return None
        # The resume re-renders the pod template from the template as it is now: that version.
        pooled = await self._pooled(template)
        if pooled is None or not poolable(pod_template):
            return None
        version = pooled[0]
        env = sandbox_env(pod_template, (meta.get("annotations") or {}).get(ANNOTATION_SANDBOX_ENV))
        token = env.pop(ACCESS_TOKEN_ENV, None)
        if not token:
            return None
        # Cached: a claim is a patch at the version listed (a pod taken since is skipped).
        pods, _ = await self._pods(selector(pool_selector(template, version)), cached=True)
        ready = [p for p in pods if claimable(p, template, version)]
        if not ready:
            return None
        return WarmResume(
            rs=rs,
            pod_template=pooled[1],
            pods=ready,
            template=template,
            version=version,
            labels=dict((pod_template.get("metadata") or {}).get("labels") or {}),
            token=token,
            env={**env, "E2B_SANDBOX_ID": name},
        )

    async def _take_warm(
        self,
        template: str,
        *,
        version: str,
        token: str,
        env: Mapping[str, str],
        claimer: str,
        pods: builtins.list[Pod] | None = None,
    ) -> Pod | None:
        """Take a ready pool pod of ``template`` (a merge patch at the version it was seen at:
        one winner) and bind its daemon to the sandbox (env, token); ``_adopt`` then makes it
        the sandbox's. None: none ready, or binding failed (that pod is deleted, never served):
        the sandbox starts cold. Only a pod made from ``version`` of the template (the labels,
        re-checked on the pod). ``pods``: the pool's pods as just listed (else listed here)."""
        spans = Spans()
        if pods is None:  # cached: the claim below is a patch at the version listed
            pods, _ = await self._pods(selector(pool_selector(template, version)), cached=True)
            spans.mark("list")
        for pod in (p for p in pods if claimable(p, template, version)):
            pod_name = pod["metadata"]["name"]
            patch = claim_patch(pod, {}, claimer=claimer)
            patch["metadata"]["annotations"][ANNOTATION_CLAIMED_AT] = str(time.time())
            try:
                with api_errors(f"claim pool pod {pod_name}"):
                    await self._core.patch_namespaced_pod(
                        pod_name, self._ns, patch, _content_type=MERGE_PATCH
                    )
            except (Conflict, NotFound, RuntimeFailure) as e:
                if isinstance(e, RuntimeFailure) and not lost_race(e):
                    raise
                continue  # another claim took it
            finally:
                spans.mark("take")
            log.info("k8s_pool_claim_taken", name=claimer, pod=pod_name)
            secret = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_SECRET, "")
            try:
                await self._bind(pod["status"]["podIP"], secret, token, env)
            except (httpx.HTTPError, RuntimeFailure) as e:
                log.warning("k8s_pool_claim_failed", name=claimer, error=str(e)[:300])
                await self._delete_pod(pod)  # never served: the sandbox starts cold
                return None
            spans.mark("init")
            log.info("k8s_pool_bound", name=claimer, pod=pod_name, **spans.as_ms())
            return pod
        return None

    async def _adopt(
        self,
        pod: Pod,
        labels: Mapping[str, str],
        *,
        claimer: str,
        owner_uid: str | None = None,
    ) -> bool:
        """Give a taken and bound pod the sandbox's pod labels, so its ReplicaSet adopts it and
        its NetworkPolicy selects it. False: that failed (the pod is deleted, never served).
        ``owner_uid``: the uid of the sandbox's ReplicaSet, when it exists (a resume): the pod
        is made its controller's in the same patch, as its adoption would (``wait_ready`` then
        need not wait for the controller to notice it)."""
        spans = Spans()
        pod_name = pod["metadata"]["name"]
        meta: dict[str, Any] = {
            "labels": dict(labels),
            "annotations": {ANNOTATION_BOUND: "true"},
        }
        if owner_uid is not None:
            meta["ownerReferences"] = [owner_reference(claimer, owner_uid)]
        try:
            with api_errors(f"label claimed pod {pod_name}"):
                await self._core.patch_namespaced_pod(
                    pod_name, self._ns, {"metadata": meta}, _content_type=MERGE_PATCH
                )
        except (RuntimeFailure, NotFound) as e:
            log.warning("k8s_pool_claim_failed", name=claimer, error=str(e)[:300])
            await self._delete_pod(pod)  # never served: the sandbox starts cold
            return False
        spans.mark("label")
        log.info("k8s_pool_claimed", name=claimer, pod=pod_name, **spans.as_ms())
        return True

    async def _ungate(self, name: str, *, drop_gated_pods: bool) -> None:
        """The sandbox's pod template loses the warm-resume gate (``.pools``). ``drop_gated_pods``:
        its pods made while it had it go too, so that its ReplicaSet makes one that starts (no
        warm pod was adopted, or a resume died between the two)."""
        with api_errors(f"lift the warm-resume gate of ReplicaSet {self._ns}/{name}"):
            await self._apps.patch_namespaced_replica_set(
                name, self._ns, UNGATE_PATCH, _content_type=STRATEGIC_PATCH
            )
        dropped = 0
        if drop_gated_pods:
            pods, _ = await self._pods(sandbox_selector(name))
            for pod in pods:
                if is_warm_gated(pod) and not is_terminating(pod):
                    await self._delete_pod(pod)
                    dropped += 1
        log.info("k8s_warm_gate_lifted", name=name, dropped=dropped)

    async def _bind(self, ip: str, secret: str, token: str, env: Mapping[str, str]) -> None:
        http = self._envd_http()
        url = f"http://{ip}:{ENVD_PORT}/init"
        body = {"envVars": dict(env), "accessToken": token}
        response = await http.post(url, json=body, headers={"X-Access-Token": secret})
        if response.status_code == 401:  # bound before (a repeated claim step)
            response = await http.post(url, json=body, headers={"X-Access-Token": token})
        if not response.is_success:
            msg = f"the warm pod's daemon refused binding ({response.status_code})"
            raise RuntimeFailure(msg)
