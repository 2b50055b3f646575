"""What a sandbox template says about the lifecycle, as the control plane needs it (pure).

``TemplateFacts`` is read from the template (``shared.runtime.template_facts``) by the services
that need it: the scaler (is the sandbox's disk kept, which version of the template runs) and
the api (at create)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class TemplateFacts(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    version: str | None = None  # a content digest of the template; None: unknown
    keeps_files: bool = True  # persist: layer (the sandbox's disk outlives a pause)


def unknown_template(name: str) -> TemplateFacts:
    """For wiring without templates (unit tests): nothing known, the default persist mode."""
    return TemplateFacts(name=name)
