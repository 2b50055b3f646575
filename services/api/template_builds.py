"""What the template routes share: the store, the publisher of build commands, the upload blobs
and signer, the build quotas; and the one rule of who sees which template."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from shared.domain.record import SandboxRecord
from shared.models.template_records import (
    BuildRecord,
    NameRecord,
    TemplateRecord,
    is_build_id,
    is_template_id,
    split_name,
)
from shared.ports.bus import Publisher


class TemplateStore(Protocol):
    """The slice of ``shared.bus.template_store.KvTemplateStore`` the API uses."""

    async def get_template(self, template_id: str) -> TemplateRecord | None: ...
    async def create_template(self, record: TemplateRecord) -> None: ...
    async def update_template(
        self, template_id: str, mutate: Callable[[TemplateRecord], TemplateRecord]
    ) -> TemplateRecord: ...
    async def delete_template(self, template_id: str) -> None: ...
    async def list_templates(self) -> list[TemplateRecord]: ...
    async def get_build(self, build_id: str) -> BuildRecord | None: ...
    async def create_build(self, record: BuildRecord) -> None: ...
    async def update_build(
        self, build_id: str, mutate: Callable[[BuildRecord], BuildRecord]
    ) -> BuildRecord: ...
    async def delete_build(self, build_id: str) -> None: ...
    async def list_builds(self, template_id: str) -> list[BuildRecord]: ...
    async def get_name(self, owner: str | None, name: str) -> NameRecord | None: ...
    async def claim_name(self, owner: str | None, record: NameRecord) -> None: ...
    async def release_name(self, owner: str | None, name: str, template_id: str) -> None: ...


@dataclass(frozen=True)
class TemplateBuilds:
    store: TemplateStore
    publisher: Publisher
    blobs: Path  # uploaded build-context archives (services.api.uploads)
    signer_key: bytes
    max_templates: int = 50  # per user
    max_concurrent_builds: int = 2  # per user
    max_upload_bytes: int = 256 * 2**20


def visible(record: TemplateRecord, user: str, *, admin: bool) -> bool:
    """A template is its owner's; an admin sees every one; a published one everyone sees."""
    return not record.deleting and (admin or record.public or record.owner == user)


async def find(
    builds: TemplateBuilds, ref: str, *, user: str, admin: bool
) -> tuple[TemplateRecord, str | None] | None:
    """The template ``ref`` names for this caller (an id, ``name`` or ``name:tag``), and the tag
    asked for; ``None`` when there is none it may see."""
    if is_template_id(ref):
        found = await builds.store.get_template(ref)
        return (found, None) if found and visible(found, user, admin=admin) else None
    name, tag = split_name(ref)
    for owner in (user, None):
        entry = await builds.store.get_name(owner, name)
        if entry is None:
            continue
        found = await builds.store.get_template(entry.template_id)
        if found is not None and visible(found, user, admin=admin):
            return found, tag
    return None


async def template_ids(
    builds: TemplateBuilds | None, records: Iterable[SandboxRecord]
) -> dict[str, str]:
    """E2B's ``templateID`` of a sandbox is its template's id, but a sandbox of a built template
    records the build it started from (the runtime's template name): build id -> template id,
    for each such build still known."""
    if builds is None:
        return {}
    shown: dict[str, str] = {}
    for ref in {r.template for r in records if is_build_id(r.template)}:
        build = await builds.store.get_build(ref)
        if build is not None:
            shown[ref] = build.template_id
    return shown
