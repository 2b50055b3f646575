"""A resume re-renders a stopped sandbox's pod template from its template as it is now (an
upgraded ``sandbox-base`` reaches a paused sandbox when it resumes)."""

from __future__ import annotations

from typing import Any

import structlog

from shared.errors import Conflict, NotFound, RuntimeFailure
from shared.runtime.kubernetes.errors import api_errors
from shared.runtime.kubernetes.namespace import JSON_PATCH, PATCH_ATTEMPTS, json_or_raise, lost_race
from shared.runtime.kubernetes.objects import (
    LABEL_TEMPLATE,
    claim_size,
    rerendered_pod_template,
    uses_claim,
)
from shared.runtime.kubernetes.pools import warm_gated
from shared.runtime.kubernetes.volume_claims import VolumeClaims

log = structlog.get_logger()


class Rerendering(VolumeClaims):
    async def _rerender(
        self, name: str, seen: dict[str, Any] | None = None, *, gate: bool = False
    ) -> bool:
        """Scale a stopped workload to 1 with its pod template rendered from the template as
        it is *now* (an upgraded ``sandbox-base`` reaches a paused sandbox when it resumes).
        False when there is nothing to re-render (already running, or a ReplicaSet that predates
        the sandbox-env record): the caller then only scales. ``seen``: the ReplicaSet as just
        read (the patch tests its version: a change since makes it read again). ``gate``: the
        template carries the warm-resume gate (a warm pod is about to be adopted, ``.pools``)."""
        what = f"re-render ReplicaSet {self._ns}/{name}"
        for _ in range(PATCH_ATTEMPTS):
            if seen is not None:
                rs, seen = seen, None
            else:
                with api_errors(what):
                    resp = await self._apps.read_namespaced_replica_set_without_preload_content(
                        name, self._ns
                    )
                    try:
                        rs = await json_or_raise(resp)
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
            if gate:
                fresh = warm_gated(fresh)
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
                if lost_race(e):
                    continue
                raise
            log.info("k8s_pod_template_rerendered", name=name, template=template, gated=gate)
            return True
        msg = f"{what}: still contended after {PATCH_ATTEMPTS} attempts"
        raise Conflict(msg)
