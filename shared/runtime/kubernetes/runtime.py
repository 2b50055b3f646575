"""The kubernetes runtime: one apps/v1 ReplicaSet per sandbox, scaled between 0 and 1.

Uses the official client's asyncio flavour (``kubernetes.aio``), so nothing blocks the event
loop. Waiting is watch-based: list once, then follow a watch from the list's resourceVersion
(relisting on 410 Gone or when a watch window ends).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx
import structlog
from kubernetes.aio import client as k8s
from kubernetes.aio import config as k8s_config
from kubernetes.aio.client.exceptions import ApiException

from shared.errors import (
    ConfigError,
    Conflict,
    NotFound,
    PodNotReady,
    ReadyFailed,
    RuntimeFailure,
    Unavailable,
    Unsupported,
)
from shared.models.network import NetworkPolicy
from shared.ports.kept_files import KeptFiles, KeptKey
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
from shared.runtime.kubernetes.built_templates import BuiltTemplates
from shared.runtime.kubernetes.errors import api_errors
from shared.runtime.kubernetes.kept import KeptFilesMover
from shared.runtime.kubernetes.objects import (
    ACCESS_TOKEN_ENV,
    ANNOTATION_PERSIST,
    ANNOTATION_SANDBOX_ENV,
    LABEL_TEMPLATE,
    Pod,
    annotation_patch,
    claim_body,
    claim_is_ours,
    claim_name,
    claim_size,
    current_pod,
    is_ready,
    is_terminating,
    network_policy_body,
    persist_mode,
    ready_endpoint,
    replica_set_body,
    rerendered_pod_template,
    revision,
    sandbox_selector,
    selector,
    to_workload,
    uses_claim,
)
from shared.runtime.kubernetes.pools import (
    ANNOTATION_BOUND,
    ANNOTATION_CLAIMED,
    ANNOTATION_CLAIMED_AT,
    ANNOTATION_SECRET,
    LABEL_POOL_VERSION,
    claim_patch,
    claimable,
    pool_pod_body,
    pool_selector,
    poolable,
    sandbox_env,
    template_version,
)
from shared.runtime.kubernetes.templates import PodTemplates
from shared.runtime.readiness import not_ready_reason
from shared.runtime.templates import parse_bytes

log = structlog.get_logger()
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
FIELD_MANAGER = "torpor"
JSON_PATCH = "application/json-patch+json"
_PATCH_ATTEMPTS = 8
T = TypeVar("T")


# Refused openly: a snapshot without its files would start sandboxes that silently lack them.
FILES_UNSUPPORTED = "snapshots with files need the kept-files store; this runtime has none"


class KubernetesRuntime:
    """``shared.ports.runtime.Runtime`` on a Kubernetes namespace."""

    def __init__(
        self,
        api: k8s.ApiClient,
        *,
        namespace: str,
        templates: PodTemplates | None = None,
        watch_window: int = 60,
        control_plane_namespace: str | None = None,
        storage_class: str | None = None,
        pools: Mapping[str, int] | None = None,
        kept_files: KeptFiles | None = None,
    ) -> None:
        self._api = api
        self._apps = k8s.AppsV1Api(api)
        self._core = k8s.CoreV1Api(api)
        self._net = k8s.NetworkingV1Api(api)
        # Where the proxy/scaler/snapshotter run, when not in the sandboxes' namespace.
        self._control_plane_ns = control_plane_namespace
        self._ns = namespace
        self._templates = templates or PodTemplates()
        # Templates users build: PodTemplate objects of the builder (services/builder).
        self._built = BuiltTemplates(self._core, namespace)
        self._watch_window = watch_window  # seconds one watch request stays open
        # The StorageClass of the sandboxes' data claims; None: the cluster's default.
        self._storage_class = storage_class
        # Warm pods per template (see .pools); kept by start_pools() (the scaler's runtime).
        self._pools = {t: n for t, n in (pools or {}).items() if n > 0}
        self._pool_task: asyncio.Task[None] | None = None
        self._http: httpx.AsyncClient | None = None
        # ``persist: store`` sandboxes' files while paused (None: such templates cannot pause).
        self._kept = KeptFilesMover(kept_files) if kept_files is not None else None

    @classmethod
    async def from_kubeconfig(
        cls,
        path: Path | None,
        *,
        namespace: str,
        context: str | None = None,
        templates: PodTemplates | None = None,
        control_plane_namespace: str | None = None,
        storage_class: str | None = None,
        pools: Mapping[str, int] | None = None,
        kept_files: KeptFiles | None = None,
    ) -> KubernetesRuntime:
        """From a kubeconfig file, or the in-cluster ServiceAccount when ``path`` is None."""
        try:
            if path is None:
                k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
                api = k8s.ApiClient()
            else:
                api = await k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
                    config_file=str(path), context=context
                )
        except (k8s_config.ConfigException, OSError) as e:
            where = "in-cluster ServiceAccount" if path is None else f"kubeconfig {path}"
            msg = f"cannot load kubernetes credentials from {where}: {e}"
            raise ConfigError(msg) from e
        return cls(
            api,
            namespace=namespace,
            templates=templates,
            control_plane_namespace=control_plane_namespace,
            storage_class=storage_class,
            pools=pools,
            kept_files=kept_files,
        )

    @property
    def namespace(self) -> str:
        return self._ns

    # ------------------------------------------------------------------ Runtime

    async def pod_template(self, name: str) -> dict[str, Any]:
        """The named template: the operator's (files or ConfigMap) first, else one a user built
        (a PodTemplate object of the builder's in this namespace)."""
        try:
            return self._templates.get(name)
        except NotFound:
            return await self._built.get(name)

    async def put_pod_template(self, name: str, template: dict[str, Any], *, build_id: str) -> None:
        """The builder's: publish a built template's (or a build pod's) pod template."""
        await self._built.put(name, template, build_id=build_id)

    async def delete_pod_template(self, name: str) -> None:
        await self._built.delete(name)

    async def create(self, spec: WorkloadSpec) -> Workload:
        template = await self.pod_template(spec.template)
        version = template_version(template)
        size = claim_size(template)  # before the data volume becomes the claim
        body = replica_set_body(spec, template)
        if (
            spec.replicas == 1
            and spec.access_token
            and self._serves(spec.template, template)
            and await self._read(spec.name) is None  # a retried create: it has its pod
        ):
            # Before the ReplicaSet exists: it adopts the warm pod as its one replica at once.
            pod_meta = body["spec"]["template"].get("metadata") or {}
            await self._claim_warm(
                spec.template,
                version=version,
                labels=dict(pod_meta.get("labels") or {}),
                token=spec.access_token,
                env={**spec.envs, "E2B_SANDBOX_ID": spec.name},
                claimer=spec.name,
            )
        # The policy exists before the first pod can start: no unfiltered window.
        await self._apply_network_policy(spec.name, spec.network)
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
        log.info("k8s_workload_created", name=spec.name, namespace=self._ns)
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
        for _ in range(_PATCH_ATTEMPTS):
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
                if not _lost_race(e):
                    raise
                if resource_version is not None:
                    msg = f"{what}: changed concurrently"
                    raise Conflict(msg) from e
                continue  # an unconditional patch just retries on the fresh object
            pods, _ = await self._pods(sandbox_selector(name))
            return to_workload(patched, pods)
        msg = f"{what}: still contended after {_PATCH_ATTEMPTS} attempts"
        raise Conflict(msg)

    async def scale(self, name: str, replicas: int) -> Workload:
        if replicas not in (0, 1):
            msg = f"replicas must be 0 or 1, not {replicas}"
            raise ValueError(msg)
        resume = await self._warm_resume(name) if replicas == 1 and self._pools else None
        if replicas == 1 and await self._rerender(name):
            pass  # the same patch set replicas and the current template
        else:
            with api_errors(f"scale ReplicaSet {self._ns}/{name}"):
                await self._apps.patch_namespaced_replica_set_scale(
                    name, self._ns, {"spec": {"replicas": replicas}}, _content_type=MERGE_PATCH
                )
        if resume is not None:
            # After the scale: a ReplicaSet at 0 would adopt the pod and delete it. Its
            # controller may have started a cold pod meanwhile; with two, it deletes the one
            # not ready, which is that one.
            await self._claim_warm(**resume)
        workload = await self.get(name)
        if workload is None:
            msg = f"ReplicaSet {self._ns}/{name} vanished while scaling"
            raise NotFound(msg)
        log.info("k8s_workload_scaled", name=name, replicas=replicas)
        return workload

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

    async def wait_ready(self, name: str, *, timeout: float) -> Endpoint:
        rs = await self._read(name)
        if rs is None or rs.metadata is None:
            msg = f"ReplicaSet {self._ns}/{name} not found"
            raise NotFound(msg)
        rs_uid = rs.metadata.uid
        try:
            async with asyncio.timeout(timeout):
                endpoint = await self._wait_pods(name, lambda pods: _ready_bound(pods, rs_uid))
        except TimeoutError:
            pass
        else:
            # Its kept files before anyone gets the pod (``persist: store``; see .kept).
            template = rs.spec.template if rs.spec else None
            meta = template.metadata if template else None
            if ((meta.annotations if meta else None) or {}).get(ANNOTATION_PERSIST) == "store":
                await self._restore_kept(name, endpoint)
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
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=10.0, trust_env=False)
        try:
            response = await self._http.get(f"http://{ip}:{ENVD_PORT}/health", timeout=2.0)
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

    # ---- kept files of persist: store (see .kept) ----------------------------------------

    async def keep_files(self, name: str) -> int:
        found = await self._store_parts(name)
        if found is None:
            return 0  # not persist: store: a claim keeps them, or nothing is kept
        kept, token, limit = found
        pods, _ = await self._pods(sandbox_selector(name))
        rs = await self._read(name)
        endpoint = ready_endpoint(pods, rs.metadata.uid if rs and rs.metadata else None)
        if endpoint is None:
            msg = f"{self._ns}/{name} has no running pod to take its kept files from"
            raise RuntimeFailure(msg)
        return await kept.export(endpoint, token, KeptKey.sandbox(name), limit=limit)

    async def _restore_kept(self, name: str, endpoint: Endpoint) -> None:
        found = await self._store_parts(name)
        if found is not None:
            kept, token, limit = found
            await kept.restore(endpoint, token, KeptKey.sandbox(name), limit=limit)

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

    async def _read_raw(self, name: str) -> dict[str, Any]:
        with api_errors(f"read ReplicaSet {self._ns}/{name}"):
            resp = await self._apps.read_namespaced_replica_set_without_preload_content(
                name, self._ns
            )
            try:
                return await _json_or_raise(resp)
            finally:
                resp.release()

    # ---- files of stored snapshots ------------------------------------------------------

    # Through the kept-files store too (see .kept): a running pod's daemon exports them (any
    # persist mode), a paused `store` sandbox's object is copied; a sandbox made from the
    # snapshot (a `store` template) gets the copy as its own object, imported by its first pod.

    async def save_files(self, name: str, snapshot_id: str) -> int:
        if self._kept is None:
            raise Unsupported(FILES_UNSUPPORTED)
        pod_template, token, limit = await self._kept_parts(name)
        key = KeptKey.snapshot(snapshot_id)
        rs = await self._read(name)
        pods, _ = await self._pods(sandbox_selector(name))
        endpoint = ready_endpoint(pods, rs.metadata.uid if rs and rs.metadata else None)
        if endpoint is not None:
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

    async def close(self) -> None:
        if self._pool_task is not None:
            self._pool_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._pool_task
        if self._http is not None:
            await self._http.aclose()
        if self._kept is not None:
            await self._kept.close()
        await self._api.close()  # type: ignore[no-untyped-call]

    # ---- warm pools (see .pools) ----------------------------------------------------------

    def start_pools(self, *, interval: float = 1.0, claim_timeout: float = 60.0) -> None:
        """Keep the configured pools filled in the background (the scaler's runtime only)."""
        if self._pools and self._pool_task is None:
            for template in self._pools:
                with contextlib.suppress(NotFound):
                    if not poolable(self._templates.get(template)):
                        log.warning("k8s_pool_not_served", template=template)
            self._pool_task = asyncio.create_task(self._keep_pools(interval, claim_timeout))

    def _serves(self, template_name: str, pod_template: Mapping[str, Any]) -> bool:
        return template_name in self._pools and poolable(pod_template)

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

    async def _keep_pools(self, interval: float, claim_timeout: float) -> None:
        while True:
            try:
                await self._refill(claim_timeout)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("k8s_pool_refill_failed")
            await asyncio.sleep(interval)

    async def _refill(self, claim_timeout: float) -> None:
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
            if len(live) < size and not waiting:  # one pod starting at a time
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

    async def _delete_pod(self, pod: Pod, *, as_seen: bool = False) -> None:
        """Delete ``pod`` (this one, by uid). ``as_seen``: only at the version it was judged at;
        a pod claimed, bound or adopted since (another scaler's claim, its ReplicaSet) stays."""
        meta = pod["metadata"]
        preconditions = {"uid": meta["uid"]}
        if as_seen:
            preconditions["resourceVersion"] = meta["resourceVersion"]
        options = k8s.V1DeleteOptions.model_validate({"preconditions": preconditions})
        try:
            with api_errors(f"delete pod {self._ns}/{meta['name']}"):
                await self._core.delete_namespaced_pod(meta["name"], self._ns, body=options)
        except (NotFound, Conflict):
            pass  # gone, or changed meanwhile: the next look decides again

    async def _warm_resume(self, name: str) -> dict[str, Any] | None:
        """What a claim for stopped workload ``name`` needs, or None when it takes no warm pod."""
        with api_errors(f"read ReplicaSet {self._ns}/{name}"):
            resp = await self._apps.read_namespaced_replica_set_without_preload_content(
                name, self._ns
            )
            try:
                rs = await _json_or_raise(resp)
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
        if not token or await self.warm_pods(template) == 0:
            return None
        return {
            "template": template,
            "version": version,
            "labels": dict((pod_template.get("metadata") or {}).get("labels") or {}),
            "token": token,
            "env": {**env, "E2B_SANDBOX_ID": name},
            "claimer": name,
        }

    async def _claim_warm(
        self,
        template: str,
        *,
        version: str,
        labels: Mapping[str, str],
        token: str,
        env: Mapping[str, str],
        claimer: str,
    ) -> bool:
        """Take a ready pool pod of ``template`` (a merge patch at the version it was seen at:
        one winner), bind its daemon to the sandbox (env, token), then give it the sandbox's
        pod labels, so its ReplicaSet adopts it and its NetworkPolicy selects it. False: none
        ready, or binding failed (that pod is deleted, never served): the sandbox starts cold.
        Only a pod made from ``version`` of the template (the labels, re-checked on the pod)."""
        pods, _ = await self._pods(selector(pool_selector(template, version)))
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
                if isinstance(e, RuntimeFailure) and not _lost_race(e):
                    raise
                continue  # another claim took it
            log.info("k8s_pool_claim_taken", name=claimer, pod=pod_name)
            secret = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_SECRET, "")
            try:
                await self._bind(pod["status"]["podIP"], secret, token, env)
                with api_errors(f"label claimed pod {pod_name}"):
                    await self._core.patch_namespaced_pod(
                        pod_name,
                        self._ns,
                        {
                            "metadata": {
                                "labels": dict(labels),
                                "annotations": {ANNOTATION_BOUND: "true"},
                            }
                        },
                        _content_type=MERGE_PATCH,
                    )
            except (httpx.HTTPError, RuntimeFailure, NotFound) as e:
                log.warning("k8s_pool_claim_failed", name=claimer, error=str(e)[:300])
                await self._delete_pod(pod)  # never served: the sandbox starts cold
                return False
            log.info("k8s_pool_claimed", name=claimer, pod=pod_name)
            return True
        return False

    async def _bind(self, ip: str, secret: str, token: str, env: Mapping[str, str]) -> None:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=10.0, trust_env=False)
        url = f"http://{ip}:{ENVD_PORT}/init"
        body = {"envVars": dict(env), "accessToken": token}
        response = await self._http.post(url, json=body, headers={"X-Access-Token": secret})
        if response.status_code == 401:  # bound before (a repeated claim step)
            response = await self._http.post(url, json=body, headers={"X-Access-Token": token})
        if not response.is_success:
            msg = f"the warm pod's daemon refused binding ({response.status_code})"
            raise RuntimeFailure(msg)

    # ------------------------------------------------------------------ helpers

    async def _rerender(self, name: str) -> bool:
        """Scale a stopped workload to 1 with its pod template rendered from the template as
        it is *now* (an upgraded ``sandbox-base`` reaches a paused sandbox when it resumes).
        False when there is nothing to re-render (already running, or a ReplicaSet that predates
        the sandbox-env record): the caller then only scales."""
        what = f"re-render ReplicaSet {self._ns}/{name}"
        for _ in range(_PATCH_ATTEMPTS):
            with api_errors(what):
                resp = await self._apps.read_namespaced_replica_set_without_preload_content(
                    name, self._ns
                )
                try:
                    rs = await _json_or_raise(resp)
                finally:
                    resp.release()
            if (rs.get("spec") or {}).get("replicas"):
                return False
            template = ((rs.get("metadata") or {}).get("labels") or {}).get(LABEL_TEMPLATE)
            if template is None:
                return False
            try:
                current = await self.pod_template(template)
            except NotFound:
                # Losing the sandbox would be worse than running it on its old template.
                log.warning("k8s_template_gone_at_resume", name=name, template=template)
                return False
            size = claim_size(current)
            fresh = rerendered_pod_template(rs, current)
            if fresh is None:
                return False
            if uses_claim(fresh):  # e.g. a template that turned from persist: none to layer
                await self._ensure_claim(name, rs["metadata"]["uid"], size)
            ops = [
                # Compare-and-set on the object as read: a concurrent writer makes this retry.
                {
                    "op": "test",
                    "path": "/metadata/resourceVersion",
                    "value": rs["metadata"]["resourceVersion"],
                },
                {"op": "replace", "path": "/spec/template", "value": fresh},
                {"op": "replace", "path": "/spec/replicas", "value": 1},
            ]
            try:
                with api_errors(what):
                    await self._apps.patch_namespaced_replica_set(
                        name, self._ns, ops, _content_type=JSON_PATCH
                    )
            except (Conflict, RuntimeFailure) as e:
                if _lost_race(e):
                    continue
                raise
            log.info("k8s_pod_template_rerendered", name=name, template=template)
            return True
        msg = f"{what}: still contended after {_PATCH_ATTEMPTS} attempts"
        raise Conflict(msg)

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
                    return await _json_or_raise(resp)
                finally:
                    resp.release()
        except NotFound:
            return None

    async def _read(self, name: str) -> k8s.V1ReplicaSet | None:
        try:
            with api_errors(f"read ReplicaSet {self._ns}/{name}"):
                return await self._apps.read_namespaced_replica_set(name, self._ns)
        except NotFound:
            return None

    async def _pods(self, label_selector: str) -> tuple[builtins.list[Pod], str]:
        """Pods as raw JSON dicts, and the list's resourceVersion to watch from."""
        with api_errors(f"list pods in {self._ns}"):
            resp = await self._core.list_namespaced_pod_without_preload_content(
                self._ns, label_selector=label_selector
            )
            try:
                body = await _json_or_raise(resp)
            finally:
                resp.release()
        return builtins.list(body.get("items") or []), str(
            body["metadata"].get("resourceVersion", "")
        )

    async def _wait_pods(self, name: str, done: Callable[[builtins.list[Pod]], T | None]) -> T:
        """List the sandbox's pods and follow a watch until ``done`` returns a value."""
        label_selector = sandbox_selector(name)
        while True:
            items, version = await self._pods(label_selector)
            pods = {p["metadata"]["uid"]: p for p in items}
            if (result := done(builtins.list(pods.values()))) is not None:
                return result
            async for kind, pod in self._watch_pods(label_selector, version):
                uid = pod["metadata"]["uid"]
                if kind == "DELETED":
                    pods.pop(uid, None)
                else:
                    pods[uid] = pod
                if (result := done(builtins.list(pods.values()))) is not None:
                    return result
            # The window ended or the version expired (410): list again and carry on.

    async def _watch_pods(
        self, label_selector: str, version: str
    ) -> AsyncIterator[tuple[str, Pod]]:
        with api_errors(f"watch pods in {self._ns}"):
            resp = await self._core.list_namespaced_pod_without_preload_content(
                self._ns,
                label_selector=label_selector,
                resource_version=version,
                watch=True,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_window,
                _request_timeout=self._watch_window + 15,
            )
        try:
            if resp.status != 200:
                await _json_or_raise(resp)
            async for line in resp.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                kind = event.get("type")
                if kind == "ERROR":  # typically 410 Gone: the caller relists
                    return
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    yield kind, event["object"]
        except (TimeoutError, ConnectionError) as e:
            log.debug("k8s_watch_ended", error=repr(e))  # relist and continue
        finally:
            resp.release()


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


def _lost_race(e: BaseException) -> bool:
    """Someone else won: a write conflict, or a JSON Patch that no longer applies.

    A failed ``test`` op (or a ``remove`` of a key deleted meanwhile) is a bare 422 "Invalid"
    without field causes; an invalid annotation is a 422 that names its fields.
    """
    if isinstance(e, Conflict):
        return True
    cause = e.__cause__
    if not isinstance(cause, ApiException) or cause.status != 422:
        return False
    try:
        details = json.loads(cause.body or "{}").get("details") or {}
    except ValueError:
        return False
    return not details.get("causes")


async def _json_or_raise(resp: Any) -> dict[str, Any]:
    text = await resp.text()
    if not 200 <= resp.status < 300:
        raise ApiException(status=resp.status, reason=resp.reason, body=text)
    body: dict[str, Any] = json.loads(text)
    return body
