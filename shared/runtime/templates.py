"""Sandbox templates: YAML files that say what a sandbox's pod looks like, shared by both runtimes.

A template is ``<dir>/<name>.yaml``. The packaged directory (``shared/runtime/templates/``) holds
``sandbox-base``; an operator's directory is searched first and may add or override templates.
Quantities use Kubernetes syntax (``512Mi``, ``2Gi``, ``500m``) so the kubernetes adapter can pass
them through unchanged.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.errors import ConfigError, NotFound
from shared.models.lifecycle import TemplateLifecycle

PACKAGED_TEMPLATES_DIR = Path(__file__).with_name("templates")
DEFAULT_TEMPLATE = "sandbox-base"
# Other names of packaged templates (E2B's SDKs and docs use both).
TEMPLATE_ALIASES = {"code-interpreter": "code-interpreter-v1"}
_TEMPLATE_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Volume(_Frozen):
    """A host directory bound into every pod of the sandbox and kept across pauses."""

    name: str
    host_path: str = Field(alias="hostPath")  # relative: under the runtime's data dir
    mount_path: str = Field(alias="mountPath")
    read_only: bool = Field(default=False, alias="readOnly")

    def resolve(self, data_dir: Path, *, sandbox_id: str, owner: str) -> Path:
        path = Path(self.host_path.format(sandbox_id=sandbox_id, owner=owner))
        return path if path.is_absolute() else data_dir / path


class Limits(_Frozen):
    memory: str | None = None  # e.g. "2Gi"
    cpu: str | None = None  # e.g. "1", "500m"
    pids: int | None = None
    nofile: int | None = None
    disk: str | None = None  # the size of /workspace (local runtime), e.g. "2Gi"

    @property
    def memory_bytes(self) -> int | None:
        return None if self.memory is None else parse_bytes(self.memory)

    @property
    def disk_bytes(self) -> int | None:
        return None if self.disk is None else parse_bytes(self.disk)

    @property
    def cpu_millis(self) -> int | None:
        return None if self.cpu is None else parse_millicpu(self.cpu)


class Resources(_Frozen):
    limits: Limits = Field(default_factory=Limits)


class Template(_Frozen):
    name: str
    workdir: str = "/workspace"
    env: dict[str, str] = Field(default_factory=dict)
    volumes: list[Volume] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)
    # Replaces the in-sandbox daemon (tests use it for pods that never become ready).
    # Placeholders: {python} {host} {port} {root}.
    command: list[str] | None = None
    # What of the sandbox's own files outlives a pause: "layer" (default) keeps its whole
    # writable filesystem (local runtime: see shared/runtime/local/layers.py); "none" gives
    # every resume a fresh disk (the seed's behaviour).
    persist: Literal["layer", "none"] = "layer"
    # Lifecycle hooks (and, later, the activity policy): docs/lifecycle-hooks.md.
    lifecycle: TemplateLifecycle = Field(default_factory=TemplateLifecycle)
    # A template users built (services/builder): its read-only layers, lowest first (keys under
    # ``<data dir>/template-layers``, local runtime), the user and the start and ready commands
    # every sandbox of it runs (the daemon reports ready once the ready command succeeds).
    layers: list[str] = Field(default_factory=list, max_length=256)
    user: Literal["root", "user"] = "user"
    start_cmd: str | None = None
    ready_cmd: str | None = None
    start_cwd: str | None = None  # where the start command runs (the build's last WORKDIR)
    image: str | None = None  # kubernetes only: the sandbox image
    kubernetes: dict[str, Any] = Field(default_factory=dict)  # adapter-specific extras


def template_version(template: Template) -> str:
    """What a pod started from ``template`` runs (image, env, limits, command, layers, ...), as
    a short digest: a warm pod of another version is never handed to a sandbox."""
    return hashlib.sha256(template.model_dump_json().encode()).hexdigest()[:16]


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def parse_bytes(quantity: str) -> int:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]i|[kMGT])?", quantity.strip())
    if not match:
        msg = f"invalid memory quantity {quantity!r} (use e.g. 512Mi or 2Gi)"
        raise ConfigError(msg)
    number, unit = match.groups()
    factor = _BINARY.get(unit or "", _DECIMAL.get(unit or "", 1))
    return int(float(number) * factor)


def parse_millicpu(quantity: str) -> int:
    text = quantity.strip()
    try:
        return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)
    except ValueError:
        msg = f"invalid cpu quantity {quantity!r} (use e.g. 1 or 500m)"
        raise ConfigError(msg) from None


def template_dirs(override: Path | None, *, built: Path | None = None) -> list[Path]:
    """The search path: the operator's directory first, then the templates users built (local
    runtime: named by their build id, which no operator template can be), then the packaged."""
    found = [override] if override is not None else []
    if built is not None:
        found.append(built)
    return [*found, PACKAGED_TEMPLATES_DIR]


def load_template(name: str, dirs: Sequence[Path]) -> Template:
    """Load ``<name>.yaml`` from the first directory that has it.

    ``NotFound`` for an unknown template, ``ConfigError`` for a malformed one.
    """
    if not _TEMPLATE_NAME_RE.match(name):
        msg = f"invalid template name {name!r}"
        raise NotFound(msg)
    if not any((folder / f"{name}.yaml").is_file() for folder in dirs):
        name = TEMPLATE_ALIASES.get(name, name)
    for folder in dirs:
        path = folder / f"{name}.yaml"
        if path.is_file():
            return _parse(path, name)
    searched = ", ".join(str(d) for d in dirs)
    msg = f"template {name!r} not found (searched {searched})"
    raise NotFound(msg)


def _parse(path: Path, name: str) -> Template:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        msg = f"template {path} is not readable YAML: {e}"
        raise ConfigError(msg) from e
    if not isinstance(raw, dict):
        msg = f"template {path} must be a YAML mapping"
        raise ConfigError(msg)
    raw.setdefault("name", name)
    try:
        template = Template.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        msg = f"template {path}: {where}: {first['msg']}"
        raise ConfigError(msg) from e
    if template.name != name:
        msg = f"template {path} is named {template.name!r}, expected {name!r}"
        raise ConfigError(msg)
    return template
