"""E2B's template API as SDK 2.63 calls it: builds and their context uploads (``.builds``),
names and tags (``.template_tags``), and here list, get, publish and delete. A template belongs
to its owner: to anyone else it does not exist (404), unless an admin published it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from services.api.deps import Caller, CallerDep, Wiring, WiringDep
from services.api.errors import ApiError
from services.api.routes import builds, template_tags
from services.api.routes.template_access import ERRORS, builds_of, own, shown
from services.api.settings import ENVD_VERSION
from services.api.template_builds import TemplateBuilds, find, visible
from services.api.template_schemas import (
    BuildOut,
    TemplateOut,
    TemplateUpdateIn,
    TemplateWithBuildsOut,
)
from shared.errors import Conflict
from shared.models.template_records import (
    DEFAULT_TAG,
    BuildStatus,
    NameRecord,
    TemplateRecord,
)

router = APIRouter(tags=["e2b templates"])
# In this order: the builds' and the tags' paths before "/templates/{template_id}".
router.include_router(builds.router)
router.include_router(template_tags.router)

# ---- list, get, publish, delete --------------------------------------------------------------


async def _out(b: TemplateBuilds, w: Wiring, t: TemplateRecord) -> TemplateOut:
    builds = await b.store.list_builds(t.template_id)
    latest = builds[-1] if builds else None
    return TemplateOut(
        template_id=t.template_id,
        build_id=t.default_build or (latest.build_id if latest else ""),
        cpu_count=t.cpu_count,
        memory_mb=t.memory_mb,
        disk_size_mb=w.settings.disk_size_mb,
        public=t.public,
        aliases=list(t.names),
        names=list(t.names),
        created_at=t.created_at,
        updated_at=t.updated_at,
        last_spawned_at=t.last_spawned_at,
        spawn_count=t.spawn_count,
        build_count=t.build_count,
        envd_version=ENVD_VERSION,
        build_status=(latest.status.value if latest else BuildStatus.WAITING.value),
    )


@router.get(
    "/templates",
    response_model=list[TemplateOut],
    responses=ERRORS,
    summary="The caller's templates and the published ones",
)
async def list_templates(
    w: WiringDep,
    caller: CallerDep,
    team_id: Annotated[None, Query(alias="teamID")] = None,
) -> list[TemplateOut]:
    b = builds_of(w)
    shown = [
        t
        for t in await b.store.list_templates()
        if visible(t, caller.name, admin=caller.user.admin)
    ]
    return [await _out(b, w, t) for t in sorted(shown, key=lambda t: t.created_at)]


@router.get(
    "/templates/{template_id}",
    response_model=TemplateWithBuildsOut,
    responses=ERRORS,
    summary="A template and its builds",
)
async def get_template(w: WiringDep, caller: CallerDep, template_id: str) -> TemplateWithBuildsOut:
    b = builds_of(w)
    found = await find(b, template_id, user=caller.name, admin=caller.user.admin)
    if found is None:
        raise ApiError(404, f"template {shown(template_id)} not found")
    template = found[0]
    base = await _out(b, w, template)
    builds = [
        BuildOut(
            build_id=x.build_id,
            status=x.status.value,
            created_at=x.created_at,
            updated_at=x.updated_at,
            finished_at=x.finished_at,
            cpu_count=x.cpu_count,
            memory_mb=x.memory_mb,
        )
        for x in await b.store.list_builds(template.template_id)
    ]
    return TemplateWithBuildsOut(**base.model_dump(), builds=builds)


@router.patch(
    "/templates/{template_id}",
    responses=ERRORS,
    summary="Publish a template (admins only) or make it private again",
)
@router.patch(
    "/v2/templates/{template_id}",
    responses=ERRORS,
    summary="Publish a template (admins only) or make it private again",
)
async def update_template(
    w: WiringDep, caller: CallerDep, template_id: str, body: TemplateUpdateIn
) -> dict[str, list[str]]:
    b = builds_of(w)
    template = await own(w, caller, template_id)
    if body.public is not None and body.public != template.public:
        if not caller.user.admin:
            raise ApiError(403, "public: only an admin can publish a template")
        for name in template.names:
            if body.public:
                try:
                    await b.store.claim_name(
                        None,
                        NameRecord(
                            template_id=template.template_id, owner=template.owner, name=name
                        ),
                    )
                except Conflict as e:
                    raise ApiError(409, f"public: the name {name!r} is published already") from e
            else:
                await b.store.release_name(None, name, template.template_id)
        public = body.public
        await b.store.update_template(
            template.template_id, lambda t: t.model_copy(update={"public": public})
        )
    return {"names": list(template.names)}


async def delete_template(w: Wiring, caller: Caller, template_id: str) -> None:
    """``DELETE /templates/{id}`` for a template (the snapshots route hands non-snapshot ids
    here). Its sandboxes keep running; no new one can start from it."""
    b = builds_of(w)
    template = await own(w, caller, template_id)
    await b.store.update_template(
        template.template_id, lambda t: t.model_copy(update={"deleting": True})
    )
    for name in template.names:
        await b.store.release_name(template.owner, name, template.template_id)
        await b.store.release_name(None, name, template.template_id)
    for build in await b.store.list_builds(template.template_id):
        await b.store.delete_build(build.build_id)
    await b.store.delete_template(template.template_id)


async def build_for_create(w: Wiring, caller: Caller, ref: str) -> str | None:
    """The ready build a create of ``ref`` starts from (its name is the runtime's template
    name), ``None`` when ``ref`` is no user template; 400 for one without a ready build."""
    if w.builds is None:
        return None
    found = await find(w.builds, ref, user=caller.name, admin=caller.user.admin)
    if found is None:
        return None
    template, tag = found
    build_id = template.tags.get(tag or DEFAULT_TAG)
    if build_id is None:
        raise ApiError(400, f"templateID: template {shown(ref)} has no ready build")
    return build_id
