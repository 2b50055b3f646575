"""Templates users build themselves (E2B's template API): the records in ``torpor_templates``.

One bucket, three kinds of key:

- ``t.<template id>``: a :class:`TemplateRecord` (owner, names, tags → builds, public);
- ``b.<build id>``: a :class:`BuildRecord` (its steps, state, logs, the built result);
- ``n.<sha256(owner, name)>``: a :class:`NameRecord`, the name (E2B's alias) → template id
  index, per owner (two users may both have a template named ``my-app``); ``n.public.<name>``
  for a published template's name.

A build goes ``waiting`` (created by the API, no steps yet) → ``building`` (steps sent, the
builder works) → ``ready`` or ``error`` (with the failing step, its exit code and its log tail).
Only a ``ready`` build can start a sandbox: a half-built template is never usable.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# E2B template ids: 20 lowercase alphanumerics. Never a snapshot id (``snap-``), never a
# packaged template's name (those have a dash).
TEMPLATE_ID_PATTERN = r"^[a-z0-9]{20}$"
_TEMPLATE_ID_RE = re.compile(TEMPLATE_ID_PATTERN)
# A template's name (E2B's alias) and a tag: no option-looking or path-like values.
NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
_NAME_RE = re.compile(NAME_PATTERN)
TAG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
_TAG_RE = re.compile(TAG_PATTERN)
DEFAULT_TAG = "default"
FILES_HASH_PATTERN = r"^[a-f0-9]{64}$"
_FILES_HASH_RE = re.compile(FILES_HASH_PATTERN)
# Under the local runtime's data dir: uploaded build contexts (per owner, by files hash), the
# built layers (by content key) and the built templates (one YAML per ready build).
TEMPLATE_FILES_DIR = "template-files"
TEMPLATE_LAYERS_DIR = "template-layers"
BUILT_TEMPLATES_DIR = "built-templates"
MAX_LOG_ENTRIES = 2000  # kept per build (the oldest go first); one entry <= MAX_LOG_CHARS
MAX_LOG_CHARS = 2000


def new_template_id() -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(20))


def new_build_id() -> str:
    return str(uuid.uuid4())


def is_template_id(value: str) -> bool:
    return bool(_TEMPLATE_ID_RE.match(value))


def is_build_id(value: str) -> bool:
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


def is_name(value: str) -> bool:
    return bool(_NAME_RE.match(value)) and ".." not in value


def is_tag(value: str) -> bool:
    return bool(_TAG_RE.match(value))


def is_files_hash(value: str) -> bool:
    return bool(_FILES_HASH_RE.match(value))


def split_name(value: str) -> tuple[str, str | None]:
    """``name:tag`` → (name, tag); a bare name → (name, None). E2B also accepts a namespace
    (``team/name``): torpor's names are per owner already, so only the last part counts."""
    base, sep, tag = value.partition(":")
    base = base.rsplit("/", 1)[-1]
    return base, (tag if sep else None)


def name_key(owner: str | None, name: str) -> str:
    """The index key of ``name`` for ``owner`` (``None``: the published names)."""
    if owner is None:
        return f"n.public.{name}"
    digest = hashlib.sha256(f"{owner}\0{name}".encode()).hexdigest()[:40]
    return f"n.{digest}"


def blob_path(root: Path, owner: str, files_hash: str) -> Path:
    """Where an uploaded build context is kept: per owner (a user's hash names only that
    user's upload: no one can plant an archive under a hash another user's build asks for)."""
    if not is_files_hash(files_hash):
        msg = "invalid files hash"
        raise ValueError(msg)
    return root / hashlib.sha256(owner.encode()).hexdigest()[:32] / f"{files_hash}.tar"


class BuildStatus(StrEnum):
    WAITING = "waiting"
    BUILDING = "building"
    READY = "ready"
    ERROR = "error"


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class TemplateRecord(_Record):
    schema_version: int = 1
    template_id: str
    owner: str
    names: list[str] = Field(default_factory=list)  # E2B aliases (without tags)
    public: bool = False
    tags: dict[str, str] = Field(default_factory=dict)  # tag → ready build id
    cpu_count: int = 2
    memory_mb: int = 1024
    build_count: int = 0
    spawn_count: int = 0
    last_spawned_at: datetime | None = None
    deleting: bool = False
    created_at: datetime
    updated_at: datetime

    @property
    def default_build(self) -> str | None:
        return self.tags.get(DEFAULT_TAG)


class NameRecord(_Record):
    template_id: str
    owner: str
    name: str


class LogLine(_Record):
    timestamp: datetime
    level: Literal["debug", "info", "warn", "error"] = "info"
    message: str
    step: str | None = None


class Step(BaseModel):
    """One step as the SDK sends it (``TemplateStep``); unknown fields are refused upstream."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    type: Literal["RUN", "COPY", "ENV", "WORKDIR", "USER"]
    args: list[str] = Field(default_factory=list, max_length=256)
    files_hash: str | None = Field(default=None, alias="filesHash")
    force: bool = False
    force_upload: bool | None = Field(default=None, alias="forceUpload")


class BuildSpec(BaseModel):
    """What the builder builds (validated by the API from ``TemplateBuildStartV2``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base: Literal["debian", "template"]  # the packaged Debian rootfs, or another template
    base_image: str | None = None  # what the SDK asked for (``debian:stable``, ``python:3``)
    base_build_id: str | None = None  # base == "template": the ready build it starts from
    steps: list[Step] = Field(default_factory=list)
    force: bool = False
    start_cmd: str | None = None
    ready_cmd: str | None = None


class Artifact(_Record):
    """A ready build, on the local runtime: its read-only layers (lowest first); on Kubernetes:
    its OCI image by digest (``registry/repository@sha256:...``); and the sandbox settings the
    steps left (env, workdir, user, start and ready commands)."""

    layers: list[str] = Field(default_factory=list)  # layer keys under the runtime's data dir
    image: str | None = None  # Kubernetes: the image the template's pod template runs
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    user: str = "user"
    start_cmd: str | None = None
    ready_cmd: str | None = None


class FailureReason(_Record):
    message: str
    step: str | None = None
    exit_code: int | None = None
    log_entries: list[LogLine] = Field(default_factory=list)


class BuildRecord(_Record):
    schema_version: int = 1
    build_id: str
    template_id: str
    owner: str
    status: BuildStatus = BuildStatus.WAITING
    tags: list[str] = Field(default_factory=list)  # what it becomes when ready
    cpu_count: int = 2
    memory_mb: int = 1024
    spec: BuildSpec | None = None
    logs: list[LogLine] = Field(default_factory=list)
    logs_dropped: int = 0  # entries dropped from the front (offsets stay right)
    cached_steps: list[int] = Field(default_factory=list)  # 1-based step numbers reused
    artifact: Artifact | None = None
    reason: FailureReason | None = None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None

    def with_logs(self, lines: list[LogLine]) -> BuildRecord:
        kept = [*self.logs, *lines]
        dropped = max(0, len(kept) - MAX_LOG_ENTRIES)
        return self.model_copy(
            update={"logs": kept[dropped:], "logs_dropped": self.logs_dropped + dropped}
        )
