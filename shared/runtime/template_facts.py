"""``read_facts``: what a template says about a sandbox's lifecycle, for either runtime.

The version is a digest of the template's content as the runtime reads it now (a resume renders
the template as it is then), so a resume report shows when a pod came back on a changed template.
A template that cannot be read is reported as unknown rather than failing the caller: the facts
describe a transition, they never decide it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import structlog

from shared.errors import ConfigError, NotFound
from shared.models.lifecycle import TemplateFacts, TemplateLifecycle, unknown_template

# Kubernetes: a PodTemplate's lifecycle section, as JSON in this annotation.
ANNOTATION_LIFECYCLE = "torpor.dev/lifecycle"

log = structlog.get_logger()


def _digest(content: object) -> str:
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def read_facts(runtime: str, templates_dir: Path | None, name: str) -> TemplateFacts:
    try:
        if runtime == "kubernetes":
            from shared.runtime.kubernetes.objects import persist_mode
            from shared.runtime.kubernetes.templates import DEFAULT_TEMPLATES, PodTemplates

            sources = (templates_dir, DEFAULT_TEMPLATES) if templates_dir else (DEFAULT_TEMPLATES,)
            pod_template = PodTemplates(*sources).get(name)
            annotations = (pod_template.get("metadata") or {}).get("annotations") or {}
            raw = annotations.get(ANNOTATION_LIFECYCLE)
            lifecycle = TemplateLifecycle.model_validate_json(raw) if raw else TemplateLifecycle()
            return TemplateFacts(
                name=name,
                version=_digest(pod_template),
                keeps_files=persist_mode(pod_template) != "none",
                hooks=lifecycle.hooks,
                activity=lifecycle.activity,
            )
        from shared.runtime.templates import load_template, template_dirs

        template = load_template(name, template_dirs(templates_dir))
        return TemplateFacts(
            name=name,
            version=_digest(template.model_dump(mode="json")),
            keeps_files=template.persist == "layer",
            hooks=template.lifecycle.hooks,
            activity=template.lifecycle.activity,
        )
    except (NotFound, ConfigError, ValueError) as e:
        log.warning("template_facts_unknown", template=name, error=str(e))
        return unknown_template(name)
