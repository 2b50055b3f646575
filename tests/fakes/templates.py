"""``TemplateStore`` in memory, with the KV adapter's semantics (create refuses a taken key,
updates are read-mutate-write, a name names one template per owner)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from shared.errors import Conflict, NotFound
from shared.models.template_records import (
    BuildRecord,
    NameRecord,
    TemplateRecord,
    is_build_id,
    is_template_id,
    name_key,
)


class FakeTemplateStore:
    def __init__(self) -> None:
        self.templates: dict[str, TemplateRecord] = {}
        self.builds: dict[str, BuildRecord] = {}
        self.names: dict[str, NameRecord] = {}

    async def get_template(self, template_id: str) -> TemplateRecord | None:
        return self.templates.get(template_id) if is_template_id(template_id) else None

    async def create_template(self, record: TemplateRecord) -> None:
        if record.template_id in self.templates:
            raise Conflict(record.template_id)
        self.templates[record.template_id] = record

    async def update_template(
        self, template_id: str, mutate: Callable[[TemplateRecord], TemplateRecord]
    ) -> TemplateRecord:
        if template_id not in self.templates:
            raise NotFound(template_id)
        new = mutate(self.templates[template_id]).model_copy(
            update={"updated_at": datetime.now(UTC)}
        )
        self.templates[template_id] = new
        return new

    async def delete_template(self, template_id: str) -> None:
        self.templates.pop(template_id, None)

    async def list_templates(self) -> list[TemplateRecord]:
        return list(self.templates.values())

    async def get_build(self, build_id: str) -> BuildRecord | None:
        return self.builds.get(build_id) if is_build_id(build_id) else None

    async def create_build(self, record: BuildRecord) -> None:
        if record.build_id in self.builds:
            raise Conflict(record.build_id)
        self.builds[record.build_id] = record

    async def update_build(
        self, build_id: str, mutate: Callable[[BuildRecord], BuildRecord]
    ) -> BuildRecord:
        if build_id not in self.builds:
            raise NotFound(build_id)
        new = mutate(self.builds[build_id]).model_copy(update={"updated_at": datetime.now(UTC)})
        self.builds[build_id] = new
        return new

    async def delete_build(self, build_id: str) -> None:
        self.builds.pop(build_id, None)

    async def list_builds(self, template_id: str) -> list[BuildRecord]:
        found = [b for b in self.builds.values() if b.template_id == template_id]
        return sorted(found, key=lambda b: b.created_at)

    async def get_name(self, owner: str | None, name: str) -> NameRecord | None:
        return self.names.get(name_key(owner, name))

    async def claim_name(self, owner: str | None, record: NameRecord) -> None:
        key = name_key(owner, record.name)
        current = self.names.get(key)
        if current is not None and current.template_id != record.template_id:
            raise Conflict(key)
        self.names[key] = record

    async def release_name(self, owner: str | None, name: str, template_id: str) -> None:
        key = name_key(owner, name)
        if key in self.names and self.names[key].template_id == template_id:
            del self.names[key]
