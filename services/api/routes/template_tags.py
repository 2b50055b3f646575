"""A template's names and tags: ``exists`` (by name), assign and remove tags, list them."""

from __future__ import annotations

from fastapi import APIRouter, Response

from services.api.deps import CallerDep, WiringDep
from services.api.errors import ApiError
from services.api.routes.template_access import ERRORS, builds_of, find_own, shown
from services.api.template_builds import find
from services.api.template_schemas import (
    AliasOut,
    AssignedTagsOut,
    AssignTagsIn,
    DeleteTagsIn,
    TagOut,
)
from shared.models.template_records import (
    DEFAULT_TAG,
    TemplateRecord,
    is_name,
    is_tag,
    split_name,
)

router = APIRouter()


@router.get(
    "/templates/aliases/{alias}",
    response_model=AliasOut,
    responses=ERRORS,
    summary="Whether a template of this name exists for the caller (Template.exists)",
)
async def alias_exists(w: WiringDep, caller: CallerDep, alias: str) -> AliasOut:
    found = await find(builds_of(w), alias, user=caller.name, admin=caller.user.admin)
    if found is not None:
        return AliasOut(template_id=found[0].template_id, public=found[0].public)
    packaged = w.settings.resolve_template(alias)
    if w.templates is not None and is_name(alias) and w.templates.exists(packaged):
        return AliasOut(template_id=alias, public=True)  # the operator's templates: everyone's
    raise ApiError(404, f"template {shown(alias)} not found")


@router.post(
    "/templates/tags",
    status_code=201,
    response_model=AssignedTagsOut,
    responses=ERRORS,
    summary="Give a ready build more tags",
)
async def assign_tags(w: WiringDep, caller: CallerDep, body: AssignTagsIn) -> AssignedTagsOut:
    b = builds_of(w)
    template, tag = await find_own(w, caller, body.target)
    build_id = template.tags.get(tag or DEFAULT_TAG)
    if build_id is None:
        raise ApiError(404, f"target: {shown(body.target)} has no ready build")
    tags = [_tag_value(template, t, field="tags") for t in body.tags]

    def add(record: TemplateRecord) -> TemplateRecord:
        return record.model_copy(update={"tags": {**record.tags, **dict.fromkeys(tags, build_id)}})

    await b.store.update_template(template.template_id, add)
    return AssignedTagsOut(tags=tags, build_id=build_id)


def _tag_value(template: TemplateRecord, value: str, *, field: str) -> str:
    """A tag alone, or ``name:tag`` of this very template."""
    name, tag = split_name(value)
    if tag is None:
        tag, name = name, ""
    elif not name:  # ":tag": a name left out is no name (E2B refuses it too)
        raise ApiError(400, f"{field}: {shown(value)} has no template name before ':'")
    if not is_tag(tag) or (name and name not in template.names):
        raise ApiError(400, f"{field}: {shown(value)} is not a tag of this template")
    return tag


@router.delete(
    "/templates/tags",
    status_code=204,
    responses=ERRORS,
    summary="Remove tags from a template",
)
async def remove_tags(w: WiringDep, caller: CallerDep, body: DeleteTagsIn) -> Response:
    b = builds_of(w)
    template, _ = await find_own(w, caller, body.name)
    tags = [_tag_value(template, t, field="tags") for t in body.tags]
    missing = [t for t in tags if t not in template.tags]
    if missing:
        raise ApiError(404, f"tags: {shown(missing[0])} not found")

    def drop(record: TemplateRecord) -> TemplateRecord:
        return record.model_copy(
            update={"tags": {k: v for k, v in record.tags.items() if k not in tags}}
        )

    await b.store.update_template(template.template_id, drop)
    return Response(status_code=204)


@router.get(
    "/templates/{template_id}/tags",
    response_model=list[TagOut],
    responses=ERRORS,
    summary="A template's tags and the builds they name",
)
async def list_tags(w: WiringDep, caller: CallerDep, template_id: str) -> list[TagOut]:
    b = builds_of(w)
    template, _ = await find_own(w, caller, template_id)
    out = []
    for tag, build_id in sorted(template.tags.items()):
        build = await b.store.get_build(build_id)
        when = (build.finished_at or build.created_at) if build else template.updated_at
        out.append(TagOut(tag=tag, build_id=build_id, created_at=when))
    return out
