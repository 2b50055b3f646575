"""One namespace of the kubernetes runtime: its API clients, the templates it serves, and the
reads, lists, watches and deletes every part of the runtime shares.

``KubernetesRuntime`` (``.runtime``) is this plus its parts: ``.volume_claims``, ``.rerendering``,
``.file_keeping``, ``.pool_filling`` and ``.pool_claiming``. Uses the official client's asyncio
flavour (``kubernetes.aio``), so nothing blocks the event loop. Waiting is watch-based: list once,
then follow a watch from the list's resourceVersion (relisting on 410 Gone or when a watch window
ends).
"""

from __future__ import annotations

import asyncio
import builtins
import json
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, Self, TypeVar

import aiohttp
import httpx
import structlog
from kubernetes.aio import client as k8s
from kubernetes.aio import config as k8s_config
from kubernetes.aio.client import rest
from kubernetes.aio.client.exceptions import ApiException

from shared.errors import ConfigError, Conflict, NotFound
from shared.ports.kept_files import KeptFiles
from shared.runtime.kubernetes.built_templates import BuiltTemplates
from shared.runtime.kubernetes.errors import api_errors
from shared.runtime.kubernetes.kept import KeptFilesMover
from shared.runtime.kubernetes.objects import Pod, sandbox_selector
from shared.runtime.kubernetes.templates import PodTemplates

log = structlog.get_logger()
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
FIELD_MANAGER = "torpor"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
PATCH_ATTEMPTS = 8
T = TypeVar("T")
# How long an idle connection to the API server is kept. aiohttp's default is 15 s; the API
# server keeps one 90 s. A claim sends requests at once (the take and the NetworkPolicy, a
# ReplicaSet read and a pod list), each on a connection of its own: with 15 s, a create or
# resume a quarter-minute after the last one paid a TLS handshake for it (4-5 ms on the rig).
API_KEEPALIVE_SECONDS = 60.0


class _KeptAlive(rest.RESTClientObject):
    """The client's connection pool, with idle connections kept ``API_KEEPALIVE_SECONDS``."""

    def _create_connector(self) -> aiohttp.TCPConnector:
        per_host = getattr(self.configuration, "tcp_connector_limit_per_host", None)
        return aiohttp.TCPConnector(
            limit=self.maxsize,
            limit_per_host=per_host or 0,
            ssl=self.ssl_context,
            keepalive_timeout=API_KEEPALIVE_SECONDS,
        )


def kept_alive(api: k8s.ApiClient) -> k8s.ApiClient:
    """``api`` with its idle connections kept ``API_KEEPALIVE_SECONDS`` (before its first use)."""
    api.rest_client = _KeptAlive(api.configuration)
    return api


class Namespace:
    """The state and the shared API calls of ``KubernetesRuntime`` in one namespace."""

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
        # Kept files being imported into a warm pod since its claim, by its pod uid (.file_keeping).
        self._imports: dict[str, asyncio.Task[bool]] = {}

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
    ) -> Self:
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
            kept_alive(api),
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

    def _envd_http(self) -> httpx.AsyncClient:
        """The one client for pods' daemons (their /health and /init), made on first use."""
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=10.0, trust_env=False)
        return self._http

    async def _read_raw(self, name: str) -> dict[str, Any]:
        with api_errors(f"read ReplicaSet {self._ns}/{name}"):
            resp = await self._apps.read_namespaced_replica_set_without_preload_content(
                name, self._ns
            )
            try:
                return await json_or_raise(resp)
            finally:
                resp.release()

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

    async def _read(self, name: str) -> k8s.V1ReplicaSet | None:
        try:
            with api_errors(f"read ReplicaSet {self._ns}/{name}"):
                return await self._apps.read_namespaced_replica_set(name, self._ns)
        except NotFound:
            return None

    async def _pods(
        self, label_selector: str, *, cached: bool = False
    ) -> tuple[builtins.list[Pod], str]:
        """Pods as raw JSON dicts, and the list's resourceVersion to watch from. ``cached``: as
        the API server's watch cache has them (``resourceVersion=0``), for a caller that
        re-checks what it acts on: a consistent list waits until that cache has caught up with
        every write since (any kind: the sandbox's NetworkPolicy, a ReplicaSet), tens of ms
        at p50 on a busy control plane."""
        with api_errors(f"list pods in {self._ns}"):
            resp = await self._core.list_namespaced_pod_without_preload_content(
                self._ns, label_selector=label_selector, resource_version="0" if cached else None
            )
            try:
                body = await json_or_raise(resp)
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
                await json_or_raise(resp)
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


def lost_race(e: BaseException) -> bool:
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


async def json_or_raise(resp: Any) -> dict[str, Any]:
    text = await resp.text()
    if not 200 <= resp.status < 300:
        raise ApiException(status=resp.status, reason=resp.reason, body=text)
    body: dict[str, Any] = json.loads(text)
    return body
