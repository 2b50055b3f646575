"""The snapshot format of the seed (the project's brief, whose example is
tests/e2e/seed_example.py; README.md, "The seed example against torpor"), exactly.

``base64(JSON({"captured_time": "<RFC 3339, UTC, Z>", "processes": [{"config": {"cmd", "args",
"cwd", "envs"?}, "pid", "tag"?}]}))``, written as the ReplicaSet annotation
``torpor.dev/snapshot`` and shown as ``metadata["snapshot"]``. Optional keys are omitted, not
null, so the JSON matches the seed's example byte for byte.
"""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from shared.errors import SnapshotTooLarge

# Kubernetes allows 256 KiB for all annotations of an object together. The snapshot gets at most
# this many bytes (base64 included); the rest is headroom for other annotations.
MAX_SNAPSHOT_ANNOTATION_BYTES = 200 * 1024


class ProcessConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    cmd: str
    args: list[str] = Field(default_factory=list)
    cwd: str | None = None
    envs: dict[str, str] = Field(default_factory=dict)

    @model_serializer
    def _ser(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cmd": self.cmd, "args": list(self.args)}
        if self.cwd:
            out["cwd"] = self.cwd
        if self.envs:
            out["envs"] = dict(self.envs)
        return out


class SnapshotProcess(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    config: ProcessConfig
    pid: int
    tag: str | None = None

    @model_serializer
    def _ser(self) -> dict[str, Any]:
        out: dict[str, Any] = {"config": self.config.model_dump(), "pid": self.pid}
        if self.tag:
            out["tag"] = self.tag
        return out


def format_captured_time(at: datetime) -> str:
    """RFC 3339 in UTC with a ``Z`` suffix and nanosecond-style precision, as in the seed."""
    at = at.astimezone(UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond:06d}000Z"


class Snapshot(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    captured_time: str
    processes: list[SnapshotProcess] = Field(default_factory=list)

    @classmethod
    def capture(cls, processes: list[SnapshotProcess], *, at: datetime) -> Snapshot:
        return cls(captured_time=format_captured_time(at), processes=processes)

    def to_json(self) -> str:
        return self.model_dump_json()

    def encode(self, *, limit: int = MAX_SNAPSHOT_ANNOTATION_BYTES) -> str:
        """The annotation value. Raises ``SnapshotTooLarge`` past ``limit`` bytes."""
        value = base64.b64encode(self.to_json().encode()).decode()
        if len(value) > limit:
            msg = f"snapshot is {len(value)} bytes encoded; the annotation budget is {limit}"
            raise SnapshotTooLarge(msg)
        return value

    @classmethod
    def decode(cls, value: str) -> Snapshot:
        return cls.model_validate_json(base64.b64decode(value))

    @property
    def id(self) -> str:
        """Content address: replays are keyed by it so a second replay is a no-op."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]
