"""Pod templates for sandbox ReplicaSets, read from YAML shipped in ``deploy/sandbox-base/``.

A template name maps to ``<dir>/<name>.yaml`` holding a core/v1 ``PodTemplate``, or to a key
``<name>.yaml`` of a ``ConfigMap`` YAML file (as mounted or applied in a cluster) whose value is
such a ``PodTemplate``. Files are cached until they change (a mounted ConfigMap is updated in
place, and a resume renders the template as it is then); every caller gets its own deep copy.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

from shared.errors import ConfigError, NotFound

# The repo's copy; deployments pass their own folder or ConfigMap file.
DEFAULT_TEMPLATES = Path(__file__).resolve().parents[3] / "deploy" / "sandbox-base"
_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")


class PodTemplates:
    """Looks up pod templates by name in a folder or a ConfigMap YAML file."""

    def __init__(self, *sources: Path) -> None:
        """Search ``sources`` (folders or ConfigMap files) in order; the repo's by default."""
        self._sources = sources or (DEFAULT_TEMPLATES,)
        # name -> (file it came from, that file's mtime when read, the template)
        self._cache: dict[str, tuple[Path, int, dict[str, Any]]] = {}

    def get(self, name: str) -> dict[str, Any]:
        """The ``template`` part (``metadata`` + ``spec``) of the named PodTemplate."""
        if not is_template_name(name):
            msg = f"invalid template name {name!r}"
            raise NotFound(msg)
        cached = self._cache.get(name)
        if cached is None or _mtime(cached[0]) != cached[1]:
            for source in self._sources:
                path = source / f"{name}.yaml" if source.is_dir() else source
                stamp = _mtime(path)
                if (found := _load(source, name)) is not None:
                    cached = self._cache[name] = (path, stamp, found)
                    break
            else:
                self._cache.pop(name, None)
                searched = ", ".join(map(str, self._sources))
                msg = f"template {name!r} not found (searched {searched})"
                raise NotFound(msg)
        return copy.deepcopy(cached[2])


def is_template_name(name: str) -> bool:
    return bool(_NAME_RE.match(name))


def pod_template_of(document: dict[str, Any], where: str) -> dict[str, Any]:
    """The ``template`` part of a PodTemplate document (checked as the files' are)."""
    return _pod_template(document, where)


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1


def _load(source: Path, name: str) -> dict[str, Any] | None:
    if source.is_dir():
        path = source / f"{name}.yaml"
        if not path.is_file():
            return None
        return _pod_template(_read_yaml(path.read_text(), path), str(path))
    if not source.is_file():
        return None
    document = _read_yaml(source.read_text(), source)
    if document.get("kind") != "ConfigMap":
        if (document.get("metadata") or {}).get("name") == name:
            return _pod_template(document, str(source))
        return None
    entry = (document.get("data") or {}).get(f"{name}.yaml")
    if entry is None:
        return None
    where = f"{source}[{name}.yaml]"
    return _pod_template(_read_yaml(entry, where), where)


def _read_yaml(text: str, where: object) -> dict[str, Any]:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as e:
        msg = f"{where}: not valid YAML: {e}"
        raise ConfigError(msg) from e
    if not isinstance(document, dict):
        msg = f"{where}: must be a YAML mapping"
        raise ConfigError(msg)
    return document


def _pod_template(document: dict[str, Any], where: str) -> dict[str, Any]:
    if document.get("kind") != "PodTemplate":
        msg = f"{where}: expected kind PodTemplate, got {document.get('kind')!r}"
        raise ConfigError(msg)
    template = document.get("template")
    containers = (template or {}).get("spec", {}).get("containers")
    if not isinstance(template, dict) or not containers:
        msg = f"{where}: template.spec.containers must list at least one container"
        raise ConfigError(msg)
    template.setdefault("metadata", {})
    return template
