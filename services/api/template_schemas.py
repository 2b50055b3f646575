"""Wire shapes of E2B's template API (SDK 2.63: ``TemplateBuildRequestV3``,
``TemplateBuildStartV2``, ``TemplateStep``, ``AssignTemplateTagsRequest``…), keys spelled as the
SDK's generated client spells them. Requests are frozen and refuse unknown keys (400 naming the
field); values torpor does not enforce are refused, never ignored."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from shared.models.template_records import FILES_HASH_PATTERN, TAG_PATTERN

MAX_STEPS = 200
MAX_ARG_CHARS = 64 * 1024
MAX_CMD_CHARS = 16 * 1024


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class _Out(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True)


def _no_nul(value: str) -> str:
    if "\0" in value:
        raise ValueError("may not contain NUL bytes")
    return value


Text = Annotated[str, AfterValidator(_no_nul)]
Arg = Annotated[str, Field(max_length=MAX_ARG_CHARS), AfterValidator(_no_nul)]
Command = Annotated[str, Field(max_length=MAX_CMD_CHARS), AfterValidator(_no_nul)]
# ``name`` or ``name:tag`` (a namespace before ``/`` is allowed and ignored).
NameArg = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_no_nul)]
Tag = Annotated[str, Field(pattern=TAG_PATTERN)]


def _zero_only(value: int | None) -> int | None:
    if value:
        raise ValueError("not supported by torpor: a minimum free disk after the build")
    return value


class TemplateBuildRequest(_In):
    """``POST /v3/templates``."""

    name: NameArg | None = None
    alias: NameArg | None = None  # older SDKs
    tags: list[NameArg] | None = Field(default=None, max_length=20)
    team_id: None = Field(default=None, alias="teamID")  # teams are not a torpor concept
    cpu_count: int | None = Field(default=None, alias="cpuCount", ge=1, le=64)
    memory_mb: int | None = Field(default=None, alias="memoryMB", ge=128, le=256 * 1024)
    min_free_disk_mb: Annotated[int | None, AfterValidator(_zero_only)] = Field(
        default=None, alias="minFreeDiskMb"
    )


class TemplateRequestResponse(_Out):
    template_id: str = Field(serialization_alias="templateID")
    build_id: str = Field(serialization_alias="buildID")
    public: bool
    names: list[str]
    tags: list[str]
    aliases: list[str]


class FileUploadOut(_Out):
    present: bool
    url: str | None = None


class StepIn(_In):
    type: Literal["RUN", "COPY", "ENV", "WORKDIR", "USER"]
    args: list[Arg] = Field(default_factory=list, max_length=256)
    files_hash: str | None = Field(default=None, alias="filesHash", pattern=FILES_HASH_PATTERN)
    force: bool = False
    force_upload: bool | None = Field(default=None, alias="forceUpload")


class TemplateBuildStart(_In):
    """``POST /v2/templates/{templateID}/builds/{buildID}``."""

    from_image: Text | None = Field(default=None, alias="fromImage", max_length=300)
    from_template: Text | None = Field(default=None, alias="fromTemplate", max_length=200)
    # Private registries are not pulled from on the local runtime: refused, never ignored.
    from_image_registry: None = Field(default=None, alias="fromImageRegistry")
    force: bool = False
    steps: list[StepIn] = Field(default_factory=list, max_length=MAX_STEPS)
    start_cmd: Command | None = Field(default=None, alias="startCmd")
    ready_cmd: Command | None = Field(default=None, alias="readyCmd")


class LogEntryOut(_Out):
    timestamp: datetime
    level: str
    message: str
    step: str | None = None


class BuildReasonOut(_Out):
    message: str
    step: str | None = None
    log_entries: list[LogEntryOut] = Field(default_factory=list, serialization_alias="logEntries")


class BuildStatusOut(_Out):
    logs: list[str]
    log_entries: list[LogEntryOut] = Field(serialization_alias="logEntries")
    template_id: str = Field(serialization_alias="templateID")
    build_id: str = Field(serialization_alias="buildID")
    status: str
    reason: BuildReasonOut | None = None


class AliasOut(_Out):
    template_id: str = Field(serialization_alias="templateID")
    public: bool


class AssignTagsIn(_In):
    target: NameArg
    tags: list[NameArg] = Field(min_length=1, max_length=20)


class AssignedTagsOut(_Out):
    tags: list[str]
    build_id: str = Field(serialization_alias="buildID")


class DeleteTagsIn(_In):
    name: NameArg
    tags: list[NameArg] = Field(min_length=1, max_length=20)


class TagOut(_Out):
    tag: str
    build_id: str = Field(serialization_alias="buildID")
    created_at: datetime = Field(serialization_alias="createdAt")


class TemplateUpdateIn(_In):
    public: bool | None = None


class BuildOut(_Out):
    build_id: str = Field(serialization_alias="buildID")
    status: str
    created_at: datetime = Field(serialization_alias="createdAt")
    updated_at: datetime = Field(serialization_alias="updatedAt")
    finished_at: datetime | None = Field(default=None, serialization_alias="finishedAt")
    cpu_count: int = Field(serialization_alias="cpuCount")
    memory_mb: int = Field(serialization_alias="memoryMB")


class TemplateOut(_Out):
    template_id: str = Field(serialization_alias="templateID")
    build_id: str = Field(serialization_alias="buildID")
    cpu_count: int = Field(serialization_alias="cpuCount")
    memory_mb: int = Field(serialization_alias="memoryMB")
    disk_size_mb: int = Field(serialization_alias="diskSizeMB")
    public: bool
    aliases: list[str]
    names: list[str]
    created_at: datetime = Field(serialization_alias="createdAt")
    updated_at: datetime = Field(serialization_alias="updatedAt")
    created_by: Any = Field(default=None, serialization_alias="createdBy")
    last_spawned_at: datetime | None = Field(serialization_alias="lastSpawnedAt")
    spawn_count: int = Field(serialization_alias="spawnCount")
    build_count: int = Field(serialization_alias="buildCount")
    envd_version: str = Field(serialization_alias="envdVersion")
    build_status: str = Field(serialization_alias="buildStatus")


class TemplateWithBuildsOut(TemplateOut):
    builds: list[BuildOut]
