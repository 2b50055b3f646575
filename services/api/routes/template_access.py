"""Who may see which template, for the template routes: the caller's own (an admin's: any),
404 for anything else; the template builds service, or 501 where it is off."""

from __future__ import annotations

from datetime import UTC, datetime

from services.api.deps import Caller, Wiring
from services.api.errors import ApiError, available, error_responses
from services.api.template_builds import TemplateBuilds, find
from shared.models.template_records import TemplateRecord, is_template_id

ERRORS = error_responses(400, 401, 403, 404, 409, 413, 429, 501, 503)


def builds_of(w: Wiring) -> TemplateBuilds:
    return available(w.builds, "template builds are")


def shown(value: str) -> str:
    return repr(value[:80])


async def own(w: Wiring, caller: Caller, template_id: str) -> TemplateRecord:
    """The caller's template (an admin's: any); 404 for anything else, even a published one."""
    b = builds_of(w)
    record = await b.store.get_template(template_id) if is_template_id(template_id) else None
    if record is None or record.deleting or (record.owner != caller.name and not caller.user.admin):
        raise ApiError(404, f"template {shown(template_id)} not found")
    return record


async def find_own(w: Wiring, caller: Caller, ref: str) -> tuple[TemplateRecord, str | None]:
    found = await find(builds_of(w), ref, user=caller.name, admin=caller.user.admin)
    if found is None or (found[0].owner != caller.name and not caller.user.admin):
        raise ApiError(404, f"template {shown(ref)} not found")
    return found


def now() -> datetime:
    return datetime.now(UTC)
