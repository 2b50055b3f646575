"""The kubernetes runtime: one apps/v1 ReplicaSet per sandbox, scaled between 0 and 1.

The Runtime port's operations on workloads; the namespace's clients and shared calls are in
``.namespace``, and the parts the operations use are the classes it is made of: data claims
(``.volume_claims``), re-rendering at resume (``.rerendering``), files through the kept-files
store (``.file_keeping``), and warm pools (``.pool_filling``, ``.pool_claiming``).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
from collections.abc import Mapping

import httpx
import structlog
from kubernetes.aio import client as k8s

from shared.errors import (
    Conflict,
    NotFound,
    PodNotReady,
    ReadyFailed,
    RuntimeFailure,
    Unavailable,
)
from shared.models.network import NetworkPolicy
from shared.ports.kept_files import KeptKey
from shared.ports.workloads import (
    ANNOTATION_NETWORK,
    ENVD_PORT,
    LABEL_MANAGED_BY,
    LABEL_SANDBOX_ID,
    MANAGED_BY,
    Endpoint,
    Workload,
    WorkloadSpec,
)
from shared.runtime.kubernetes.errors import api_errors
from shared.runtime.kubernetes.file_keeping import FileKeeping
from shared.runtime.kubernetes.namespace import (
    APPLY_PATCH,
    FIELD_MANAGER,
    JSON_PATCH,
    MERGE_PATCH,
    PATCH_ATTEMPTS,
    lost_race,
)
from shared.runtime.kubernetes.objects import (
    ANNOTATION_PERSIST,
    Pod,
    annotation_patch,
    claim_size,
    current_pod,
    network_policy_body,
    persist_mode,
    ready_endpoint,
    replica_set_body,
    revision,
    sandbox_selector,
    selector,
    to_workload,
    uses_claim,
)
from shared.runtime.kubernetes.pool_claiming import PoolClaiming
from shared.runtime.kubernetes.pools import (
    ANNOTATION_BOUND,
    ANNOTATION_CLAIMED,
    WARM_GATE,
    template_version,
)
from shared.runtime.kubernetes.rerendering import Rerendering
from shared.runtime.readiness import not_ready_reason
from shared.spans import Spans

log = structlog.get_logger()


class KubernetesRuntime(PoolClaiming, FileKeeping, Rerendering):
    """``shared.ports.runtime.Runtime`` on a Kubernetes namespace."""

    async def create(self, spec: WorkloadSpec) -> Workload:
        spans = Spans()
        template = await self.pod_template(spec.template)
        version = template_version(template)
        size = claim_size(template)  # before the data volume becomes the claim
        body = replica_set_body(spec, template)
        spans.mark("template")

        async def take() -> Pod | None:
            if not (
                spec.replicas == 1
                and spec.access_token
                and self._serves(spec.template, template)
                and await self._read(spec.name) is None  # a retried create: it has its pod
            ):
                return None
            # Taken and bound, not yet the sandbox's (no label its policy selects): it runs
            # only its daemon, which serves nobody but the runtime until it has the token.
            return await self._take_warm(
                spec.template,
                version=version,
                token=spec.access_token,
                env={**spec.envs, "E2B_SANDBOX_ID": spec.name},
                claimer=spec.name,
            )

        # The policy exists before the first pod can start, and before a warm pod becomes the
        # sandbox's (labelled below): no unfiltered window. Made while the pod is taken.
        got, applied = await asyncio.gather(
            take(), self._apply_network_policy(spec.name, spec.network), return_exceptions=True
        )
        taken = got if isinstance(got, dict) else None
        if isinstance(applied, BaseException):
            if taken is not None:
                await self._delete_pod(taken)  # taken for nothing: it goes, never served
            raise applied
        if isinstance(got, BaseException):
            raise got
        spans.mark("take_and_policy")
        if taken is not None:
            # Before the ReplicaSet exists: it adopts the warm pod as its one replica at once.
            pod_meta = body["spec"]["template"].get("metadata") or {}
            await self._adopt(taken, dict(pod_meta.get("labels") or {}), claimer=spec.name)
            spans.mark("adopt")
        what = f"create ReplicaSet {self._ns}/{spec.name}"
        try:
            with api_errors(what):
                rs = await self._apps.create_namespaced_replica_set(
                    self._ns, k8s.V1ReplicaSet.model_validate(body)
                )
        except Conflict:
            # Idempotent: it exists already (a retried create also ensures its claim).
            found = await self._read(spec.name)
            if found is None or found.metadata is None or found.metadata.uid is None:
                raise
            if uses_claim(body["spec"]["template"]):
                await self._ensure_claim(spec.name, found.metadata.uid, size)
            existing = await self.get(spec.name)
            if existing is None:
                raise
            return existing
        spans.mark("replica_set")
        log.info("k8s_workload_created", name=spec.name, namespace=self._ns, **spans.as_ms())
        # After the ReplicaSet, which owns it: no claim without an owner. Its pods wait for it.
        if uses_claim(body["spec"]["template"]):
            assert rs.metadata is not None
            assert rs.metadata.uid is not None
            await self._ensure_claim(spec.name, rs.metadata.uid, size)
        return to_workload(rs, [])

    async def get(self, name: str) -> Workload | None:
        rs = await self._read(name)
        if rs is None:
            return None
        pods, _ = await self._pods(sandbox_selector(name))
        return to_workload(rs, pods)

    async def patch_annotations(
        self,
        name: str,
        annotations: Mapping[str, str | None],
        *,
        resource_version: str | None = None,
    ) -> Workload:
        what = f"annotate ReplicaSet {self._ns}/{name}"
        # The pods (for the answer; cached) while the ReplicaSet is read: an annotation patch
        # changes no pod, and a replay's mark is on a resume's path.
        rs, (pods, _) = await asyncio.gather(
            self._read(name), self._pods(sandbox_selector(name), cached=True)
        )
        for attempt in range(PATCH_ATTEMPTS):
            if attempt:
                rs = await self._read(name)
            if rs is None:
                msg = f"ReplicaSet {self._ns}/{name} not found"
                raise NotFound(msg)
            seen = revision(rs)
            if resource_version is not None and seen != resource_version:
                msg = f"{what}: revision is {seen}, not {resource_version}"
                raise Conflict(msg)
            ops = annotation_patch(rs, annotations, seen)
            try:
                with api_errors(what):
                    patched = await self._apps.patch_namespaced_replica_set(
                        name, self._ns, ops, _content_type=JSON_PATCH
                    )
            except (Conflict, RuntimeFailure) as e:
                if not lost_race(e):
                    raise
                if resource_version is not None:
                    msg = f"{what}: changed concurrently"
                    raise Conflict(msg) from e
                continue  # an unconditional patch just retries on the fresh object
            return to_workload(patched, pods)
        msg = f"{what}: still contended after {PATCH_ATTEMPTS} attempts"
        raise Conflict(msg)

    async def scale(self, name: str, replicas: int) -> None:
        if replicas not in (0, 1):
            msg = f"replicas must be 0 or 1, not {replicas}"
            raise ValueError(msg)
        spans = Spans()
        resume = await self._warm_resume(name) if replicas == 1 and self._pools else None
        spans.mark("warm_resume")
        taken: Pod | None = None
        if resume is not None:
            # Taken and bound before the scale (not yet the sandbox's: no label it selects),
            # so that the window in which the ReplicaSet wants a pod it has not got (and starts
            # a cold one) is the one label patch after the scale.
            taken = await self._take_warm(
                resume.template,
                version=resume.version,
                token=resume.token,
                env=resume.env,
                claimer=name,
                pods=resume.pods,
            )
            spans.mark("take")
        adopted = tried = gated = False
        try:
            if taken is not None and resume is not None:
                # Its kept files (persist: store) go in while the rest happens.
                endpoint = Endpoint(host=taken["status"]["podIP"], pod_uid=taken["metadata"]["uid"])
                self._import_early(name, endpoint, resume.token, resume.pod_template)
            rs = resume.rs if resume is not None else None
            # With a warm pod taken, the pod template is gated: what the ReplicaSet makes before
            # the adoption below is never started, and goes once it has the warm pod.
            if replicas == 1 and await self._rerender(name, rs, gate=taken is not None):
                gated = taken is not None
                spans.mark("rerender")
            else:
                spans.mark("rerender")
                with api_errors(f"scale ReplicaSet {self._ns}/{name}"):
                    await self._apps.patch_namespaced_replica_set_scale(
                        name, self._ns, {"spec": {"replicas": replicas}}, _content_type=MERGE_PATCH
                    )
                spans.mark("patch_scale")
            if taken is not None and resume is not None:
                # After the scale: a ReplicaSet at 0 would adopt the pod and delete it. Its
                # controller may have made a (gated) pod meanwhile; with two, it deletes the one
                # not scheduled, or else not ready, which is that one.
                owner_uid = (resume.rs.get("metadata") or {}).get("uid")
                tried = True
                adopted = await self._adopt(taken, resume.labels, claimer=name, owner_uid=owner_uid)
                spans.mark("adopt")
        finally:
            if taken is not None and not adopted:
                await self._forget_import(taken["metadata"]["uid"])
                if not tried:  # _adopt deletes the pod it fails to label
                    await self._delete_pod(taken)  # taken for nothing: it goes, never served
            if gated:
                # Before anything else may make a pod of it (a crash of the pod, the next
                # resume); not adopted: the gated pod goes, and a cold one starts.
                await self._ungate(name, drop_gated_pods=not adopted)
                spans.mark("ungate")
        log.info("k8s_workload_scaled", name=name, replicas=replicas, **spans.as_ms())

    async def set_network(self, name: str, policy: NetworkPolicy) -> None:
        # Recorded on the ReplicaSet too (NotFound for a missing workload), then enforced by the
        # sandbox's NetworkPolicy, which selects its pods by label: kept across scale 0/1.
        await self.patch_annotations(name, {ANNOTATION_NETWORK: policy.model_dump_json()})
        await self._apply_network_policy(name, policy)

    async def _apply_network_policy(self, name: str, policy: NetworkPolicy) -> None:
        body = network_policy_body(name, policy, control_plane_namespace=self._control_plane_ns)
        with api_errors(f"apply NetworkPolicy {self._ns}/{name}"):
            await self._net.patch_namespaced_network_policy(
                name,
                self._ns,
                body,
                field_manager=FIELD_MANAGER,
                force=True,
                _content_type=APPLY_PATCH,
            )
        log.info("k8s_network_policy_applied", name=name, egress_rules=len(body["spec"]["egress"]))

    async def wait_ready(self, name: str, *, timeout: float, answering: bool = False) -> Endpoint:
        # ``answering`` is not told apart here yet: a pod counts once Ready (its kept files are
        # restored at that point), so a ready command depending on its start command's process
        # still cannot pass on a resume on Kubernetes.
        del answering
        spans = Spans()
        rs = await self._read(name)
        if rs is None or rs.metadata is None:
            msg = f"ReplicaSet {self._ns}/{name} not found"
            raise NotFound(msg)
        rs_uid = rs.metadata.uid
        pod_spec = rs.spec.template.spec if rs.spec and rs.spec.template else None
        if pod_spec is not None and any(
            g.name == WARM_GATE for g in pod_spec.scheduling_gates or []
        ):
            # A resume ended between gating its pod template and lifting the gate (it died): a
            # gated pod is never scheduled. Harmless should one be mid-way (its pod starts cold).
            await self._ungate(name, drop_gated_pods=True)
        try:
            async with asyncio.timeout(timeout):
                endpoint = await self._wait_pods(name, lambda pods: _ready_bound(pods, rs_uid))
        except TimeoutError:
            pass
        else:
            spans.mark("pod")
            # Its kept files before anyone gets the pod (``persist: store``; see .kept).
            template = rs.spec.template if rs.spec else None
            meta = template.metadata if template else None
            if ((meta.annotations if meta else None) or {}).get(ANNOTATION_PERSIST) == "store":
                await self._restore_kept(name, endpoint)
                spans.mark("kept")
            log.info("k8s_ready", name=name, warm=endpoint.warm, **spans.as_ms())
            return endpoint
        waiting = await self._ready_command_failure(name, rs_uid)
        if waiting is not None:
            # Up, but its ready command kept failing: waiting longer will not heal it.
            msg = f"pod of {self._ns}/{name} not ready within {timeout:g}s: {waiting}"
            raise ReadyFailed(msg)
        msg = f"no ready pod for {self._ns}/{name} within {timeout:g}s"
        raise PodNotReady(msg)

    async def _ready_command_failure(self, name: str, rs_uid: str | None) -> str | None:
        """Why the workload's live pod is not ready when its daemon says it still waits for
        the template's ready command (one probe of its /health), else None (down, no pod)."""
        pods, _ = await self._pods(sandbox_selector(name))
        pod = current_pod(pods, rs_uid)
        ip = (pod or {}).get("status", {}).get("podIP")
        if not ip:
            return None
        try:
            response = await self._envd_http().get(f"http://{ip}:{ENVD_PORT}/health", timeout=2.0)
        except httpx.HTTPError:
            return None
        return not_ready_reason(response.status_code, response.content)

    async def wait_stopped(self, name: str, *, timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                await self._wait_pods(name, lambda pods: True if not pods else None)
        except TimeoutError:
            msg = f"pods of {self._ns}/{name} still exist after {timeout:g}s"
            raise RuntimeFailure(msg) from None

    async def delete(self, name: str, *, pods_gone_timeout: float = 60.0) -> None:
        """Delete the ReplicaSet and wait (watch) until its pods are gone too: the port promises
        the pods are deleted, and the garbage collector removes them asynchronously."""
        kept_in_store: bool | None = None  # None: no ReplicaSet any more (a repeated delete)
        if self._kept is not None:
            with contextlib.suppress(NotFound):
                template = (await self._read_raw(name)).get("spec", {}).get("template") or {}
                kept_in_store = persist_mode(template) == "store"
        try:
            with api_errors(f"delete ReplicaSet {self._ns}/{name}"):
                await self._apps.delete_namespaced_replica_set(
                    name, self._ns, propagation_policy="Background"
                )
        except NotFound:
            pass
        else:
            log.info("k8s_workload_deleted", name=name, namespace=self._ns)
        if self._pools:  # a claimed warm pod its ReplicaSet never adopted goes too
            pods, _ = await self._pods(sandbox_selector(name))
            for pod in pods:
                if not pod["metadata"].get("ownerReferences"):
                    await self._delete_pod(pod)
        await self.wait_stopped(name, timeout=pods_gone_timeout)
        # The kept files go with the sandbox (the garbage collector would delete the owned claim
        # too; this does not wait for it, and covers a claim whose owner is already gone).
        await self._delete_claim(name)
        if self._kept is not None and kept_in_store is not False:
            try:
                await self._kept.forget(KeptKey.sandbox(name))
            except Unavailable:
                if kept_in_store:
                    raise  # its files must go: the delete is retried
                log.warning("k8s_kept_files_not_forgotten", name=name)  # a repeat: best effort
        try:
            with api_errors(f"delete NetworkPolicy {self._ns}/{name}"):
                await self._net.delete_namespaced_network_policy(name, self._ns)
        except NotFound:
            pass

    async def list(self, *, labels: Mapping[str, str] | None = None) -> list[Workload]:
        wanted = selector({**(labels or {}), LABEL_MANAGED_BY: MANAGED_BY})
        with api_errors(f"list ReplicaSets in {self._ns}"):
            sets = await self._apps.list_namespaced_replica_set(self._ns, label_selector=wanted)
        pods, _ = await self._pods(selector({LABEL_MANAGED_BY: MANAGED_BY}))
        by_sandbox: dict[str, builtins.list[Pod]] = {}
        for pod in pods:
            sandbox = (pod["metadata"].get("labels") or {}).get(LABEL_SANDBOX_ID, "")
            by_sandbox.setdefault(sandbox, []).append(pod)
        return [
            to_workload(rs, by_sandbox.get(rs.metadata.name or "", []) if rs.metadata else [])
            for rs in sets.items
        ]

    async def close(self) -> None:
        for uid in list(self._imports):
            await self._forget_import(uid)
        if self._pool_task is not None:
            self._pool_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._pool_task
        if self._http is not None:
            await self._http.aclose()
        if self._kept is not None:
            await self._kept.close()
        await self._api.close()  # type: ignore[no-untyped-call]


def _ready_bound(pods: builtins.list[Pod], rs_uid: str | None) -> Endpoint | None:
    """The ready endpoint, ``warm`` for a claimed pool pod; never a claimed pod not yet bound
    (its daemon holds the pool's token: its claimer died, the pool sweep deletes it)."""
    usable = [
        p
        for p in pods
        if ANNOTATION_CLAIMED not in (a := p["metadata"].get("annotations") or {})
        or ANNOTATION_BOUND in a
    ]
    endpoint = ready_endpoint(usable, rs_uid)
    if endpoint is None:
        return None
    pod = next(p for p in usable if p["metadata"]["uid"] == endpoint.pod_uid)
    warm = ANNOTATION_CLAIMED in (pod["metadata"].get("annotations") or {})
    return endpoint.model_copy(update={"warm": warm})
