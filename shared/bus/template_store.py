"""``TemplateStore`` over the NATS KV bucket ``torpor_templates``: templates, builds and the name
index (see ``shared.models.template_records``). Writes of records are compare-and-set."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from pydantic import BaseModel

from shared.bus.kv import key_names, read_record
from shared.errors import Conflict, NotFound
from shared.models.template_records import (
    BuildRecord,
    NameRecord,
    TemplateRecord,
    is_build_id,
    is_template_id,
    name_key,
)

_CAS_ATTEMPTS = 32
R = TypeVar("R", bound=BaseModel)


class KvTemplateStore:
    """Over an open bucket, or an opener called on first use."""

    def __init__(self, kv: KeyValue | Callable[[], Awaitable[KeyValue]]) -> None:
        self._kv_: KeyValue | None = kv if isinstance(kv, KeyValue) else None
        self._open = None if isinstance(kv, KeyValue) else kv

    async def _bucket(self) -> KeyValue:
        if self._kv_ is None:
            assert self._open is not None
            self._kv_ = await self._open()
        return self._kv_

    async def _entry(self, key: str, model: type[R]) -> tuple[R, int] | None:
        return await read_record(await self._bucket(), key, model)

    async def _create(self, key: str, record: BaseModel) -> None:
        kv = await self._bucket()
        try:
            await kv.create(key, record.model_dump_json().encode())
        except KeyWrongLastSequenceError as e:
            raise Conflict(f"{key} already exists") from e

    async def _update(self, key: str, model: type[R], mutate: Callable[[R], R]) -> R:
        kv = await self._bucket()
        for _ in range(_CAS_ATTEMPTS):
            found = await self._entry(key, model)
            if found is None:
                raise NotFound(f"{key} not found")
            record, revision = found
            new = mutate(record)
            if new is record:
                return record
            if "updated_at" in type(new).model_fields:
                new = new.model_copy(update={"updated_at": datetime.now(UTC)})
            try:
                await kv.update(key, new.model_dump_json().encode(), last=revision)
            except KeyWrongLastSequenceError:
                await asyncio.sleep(0)
                continue
            return new
        raise Conflict(f"{key}: too much contention on its record")

    async def _delete(self, key: str) -> None:
        kv = await self._bucket()
        with contextlib.suppress(KeyNotFoundError):
            await kv.delete(key)

    # ---- templates ---------------------------------------------------------------------------

    async def get_template(self, template_id: str) -> TemplateRecord | None:
        if not is_template_id(template_id):  # never a hostile string as a KV key
            return None
        found = await self._entry(f"t.{template_id}", TemplateRecord)
        return found[0] if found else None

    async def create_template(self, record: TemplateRecord) -> None:
        await self._create(f"t.{record.template_id}", record)

    async def update_template(
        self, template_id: str, mutate: Callable[[TemplateRecord], TemplateRecord]
    ) -> TemplateRecord:
        return await self._update(f"t.{template_id}", TemplateRecord, mutate)

    async def delete_template(self, template_id: str) -> None:
        await self._delete(f"t.{template_id}")

    async def list_templates(self) -> list[TemplateRecord]:
        kv = await self._bucket()
        out = []
        for key in await key_names(kv):
            if key.startswith("t.") and (found := await self.get_template(key[2:])):
                out.append(found)
        return out

    # ---- builds ------------------------------------------------------------------------------

    async def get_build(self, build_id: str) -> BuildRecord | None:
        if not is_build_id(build_id):
            return None
        found = await self._entry(f"b.{build_id}", BuildRecord)
        return found[0] if found else None

    async def create_build(self, record: BuildRecord) -> None:
        await self._create(f"b.{record.build_id}", record)

    async def update_build(
        self, build_id: str, mutate: Callable[[BuildRecord], BuildRecord]
    ) -> BuildRecord:
        return await self._update(f"b.{build_id}", BuildRecord, mutate)

    async def delete_build(self, build_id: str) -> None:
        await self._delete(f"b.{build_id}")

    async def list_builds(self, template_id: str) -> list[BuildRecord]:
        return [b for b in await self.list_all_builds() if b.template_id == template_id]

    async def list_all_builds(self) -> list[BuildRecord]:
        """Every build of every template (the builder's garbage collection keeps their files)."""
        kv = await self._bucket()
        out = []
        for key in await key_names(kv):
            found = await self.get_build(key[2:]) if key.startswith("b.") else None
            if found is not None:
                out.append(found)
        return sorted(out, key=lambda b: b.created_at)

    # ---- names -------------------------------------------------------------------------------

    async def get_name(self, owner: str | None, name: str) -> NameRecord | None:
        found = await self._entry(name_key(owner, name), NameRecord)
        return found[0] if found else None

    async def claim_name(self, owner: str | None, record: NameRecord) -> None:
        """``Conflict`` when the name is another template's."""
        try:
            await self._create(name_key(owner, record.name), record)
        except Conflict:
            current = await self.get_name(owner, record.name)
            if current is None or current.template_id != record.template_id:
                raise

    async def release_name(self, owner: str | None, name: str, template_id: str) -> None:
        current = await self.get_name(owner, name)
        if current is not None and current.template_id == template_id:
            await self._delete(name_key(owner, name))
