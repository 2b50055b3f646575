"""Pod templates of templates users build (services/builder on Kubernetes): ``PodTemplate``
objects in the sandboxes' namespace, named by the ready build's id (and ``bld-<build id>`` for
a build's own pod while it runs), labelled as torpor's.

The builder creates them; the runtime reads them when a sandbox's template is none of the
operator's files. A ready build's pod template never changes (its image is referenced by
digest), so a read one is kept (bounded); a deleted one stays usable by sandboxes already
created from it, as the local runtime's built templates do.
"""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from typing import Any

from kubernetes.aio import client as k8s
from kubernetes.aio.client.exceptions import ApiException

from shared.errors import ConfigError, Conflict, NotFound
from shared.ports.workloads import LABEL_MANAGED_BY, MANAGED_BY
from shared.runtime.kubernetes.errors import api_errors
from shared.runtime.kubernetes.templates import is_template_name, pod_template_of

LABEL_BUILT = "torpor.dev/built-template"
_CACHED = 256


class BuiltTemplates:
    def __init__(self, core: k8s.CoreV1Api, namespace: str) -> None:
        self._core = core
        self._ns = namespace
        self._cache: OrderedDict[str, dict[str, Any]] = OrderedDict()

    async def get(self, name: str) -> dict[str, Any]:
        """The ``template`` part of the named PodTemplate object (``NotFound`` otherwise)."""
        if not is_template_name(name):
            raise NotFound(f"invalid template name {name!r}")
        found = self._cache.get(name)
        if found is None:
            found = await self._read(name)
            self._cache[name] = found
            while len(self._cache) > _CACHED:
                self._cache.popitem(last=False)
        self._cache.move_to_end(name)
        return copy.deepcopy(found)

    async def _read(self, name: str) -> dict[str, Any]:
        what = f"read PodTemplate {self._ns}/{name}"
        with api_errors(what):
            resp = await self._core.read_namespaced_pod_template_without_preload_content(
                name, self._ns
            )
            try:
                text = await resp.text()
                if resp.status == 404:
                    raise NotFound(f"template {name!r} not found")
                if not 200 <= resp.status < 300:
                    raise ApiException(status=resp.status, reason=resp.reason, body=text)
            finally:
                resp.release()
        document = json.loads(text)
        labels = (document.get("metadata") or {}).get("labels") or {}
        if labels.get(LABEL_MANAGED_BY) != MANAGED_BY or LABEL_BUILT not in labels:
            # Someone else's object of that name is never a sandbox's template.
            raise NotFound(f"template {name!r} not found")
        try:
            return pod_template_of(document, f"PodTemplate {self._ns}/{name}")
        except ConfigError as e:
            raise NotFound(f"template {name!r} is broken: {e}") from e

    async def put(self, name: str, template: dict[str, Any], *, build_id: str) -> None:
        """Create (or replace: a retried build) the named PodTemplate object."""
        body = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {
                "name": name,
                "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_BUILT: build_id},
            },
            "template": template,
        }
        what = f"create PodTemplate {self._ns}/{name}"
        try:
            with api_errors(what):
                await self._core.create_namespaced_pod_template(
                    self._ns, k8s.V1PodTemplate.model_validate(body)
                )
        except Conflict:
            await self.delete(name)
            with api_errors(what):
                await self._core.create_namespaced_pod_template(
                    self._ns, k8s.V1PodTemplate.model_validate(body)
                )
        self._cache.pop(name, None)

    async def delete(self, name: str) -> None:
        self._cache.pop(name, None)
        try:
            with api_errors(f"delete PodTemplate {self._ns}/{name}"):
                await self._core.delete_namespaced_pod_template(name, self._ns)
        except NotFound:
            return
