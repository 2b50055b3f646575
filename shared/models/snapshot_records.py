"""A stored snapshot (E2B's ``create_snapshot``): one KV entry per snapshot in ``torpor_snapshots``.

A snapshot is a sandbox's process list (``shared.models.snapshots``, the same value a pause
stores) plus its files (kept by the runtime under the snapshot id), so any number of sandboxes can
start from it: files copied, processes replayed, like a resume. It belongs to its owner alone:
to everyone else it does not exist. Writes are compare-and-set on the revision, like sandboxes.

States: ``taking`` (record written by the api, the snapshotter is capturing) → ``ready`` (usable)
or ``failed`` (the reason is kept); ``deleting`` (hidden; the snapshotter removes the files, then
the key). Only ``ready`` snapshots are listed or usable.
"""

from __future__ import annotations

import re
import secrets
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from shared.models.lifecycle import NO_HOOKS, Hooks
from shared.models.network import OPEN, NetworkPolicy

# ``snap-`` + 20 lowercase alphanumerics: a KV key, a NATS token, a path segment, and a value of
# ``templateID`` no template can have (template names never start with ``snap-``).
SNAPSHOT_ID_PATTERN = r"^snap-[a-z0-9]{20}$"
_SNAPSHOT_ID_RE = re.compile(SNAPSHOT_ID_PATTERN)
# E2B snapshot names (``create_snapshot(name=...)``): like template names, mixed case allowed.
SNAPSHOT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
_SNAPSHOT_NAME_RE = re.compile(SNAPSHOT_NAME_PATTERN)
SNAPSHOT_PREFIX = "snap-"
NAME_TAG = "default"  # E2B's names carry a tag: ``<namespace>/<name>:<tag>``


def new_snapshot_id() -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return SNAPSHOT_PREFIX + "".join(secrets.choice(alphabet) for _ in range(20))


def is_snapshot_id(value: str) -> bool:
    return bool(_SNAPSHOT_ID_RE.match(value))


def looks_like_snapshot_id(value: str) -> bool:
    """Anything under the reserved prefix is meant as a snapshot (unknown ones are 404)."""
    return value.startswith(SNAPSHOT_PREFIX)


def is_valid_snapshot_name(value: str) -> bool:
    return bool(_SNAPSHOT_NAME_RE.match(value))


class SnapshotState(StrEnum):
    TAKING = "taking"
    READY = "ready"
    FAILED = "failed"
    DELETING = "deleting"


class SnapshotRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    schema_version: int = 1
    snapshot_id: str
    owner: str
    source_sandbox_id: str
    name: str | None = None
    state: SnapshotState = SnapshotState.TAKING
    # What a sandbox started from it gets (the source's, at capture time).
    template: str
    envs: dict[str, str] = Field(default_factory=dict)
    network: NetworkPolicy = OPEN
    hooks: Hooks = NO_HOOKS  # the source's own lifecycle hooks (the template's apply anyway)
    annotation: str | None = None  # base64 ``Snapshot`` (process list); set when ready
    process_count: int = 0
    files_bytes: int | None = None  # what the runtime stored for the files
    files_only: bool = False  # E2B memory=false: sandboxes from it start no processes
    internal: bool = False  # fork's own snapshot: not listed, deleted after the forks start
    failure: str | None = None
    failure_status: int | None = None  # the HTTP status a failed take answers (e.g. 501)
    created_at: datetime
    retain_until: datetime
    updated_at: datetime

    @property
    def names(self) -> list[str]:
        """E2B's ``names``: ``<owner>/<name>:default`` for a named snapshot, else none."""
        return [f"{self.owner}/{self.name}:{NAME_TAG}"] if self.name else []
