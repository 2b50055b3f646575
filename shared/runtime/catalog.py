"""Which sandbox templates exist, asked before a create is accepted: an unknown template is a
400 naming the field, not a record that fails later. Reads the same folders the configured
runtime reads (``TORPOR_TEMPLATES_DIR``, then the packaged ones)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from shared.errors import ConfigError, NotFound
from shared.settings import RuntimeSettings


class TemplateCatalog(Protocol):
    def exists(self, name: str) -> bool: ...


class FileTemplateCatalog:
    """Local runtime: ``<name>.yaml`` templates; Kubernetes: PodTemplates (folder or ConfigMap)."""

    def __init__(self, runtime: str, templates_dir: Path | None) -> None:
        self._runtime = runtime
        self._dir = templates_dir

    @classmethod
    def from_settings(cls, settings: RuntimeSettings) -> FileTemplateCatalog:
        return cls(settings.runtime, settings.templates_dir)

    def exists(self, name: str) -> bool:
        try:
            if self._runtime == "kubernetes":
                from shared.runtime.kubernetes.templates import DEFAULT_TEMPLATES, PodTemplates

                sources = (self._dir, DEFAULT_TEMPLATES) if self._dir else (DEFAULT_TEMPLATES,)
                PodTemplates(*sources).get(name)
            else:
                from shared.runtime.templates import load_template, template_dirs

                load_template(name, template_dirs(self._dir))
        except NotFound:
            return False
        except ConfigError:
            return True  # it exists but is broken: the create reports that as a failure
        return True
