"""A build's base and steps as a client sends them, checked (hostile input: every field named
in a 400) into the ``BuildSpec`` the builder runs."""

from __future__ import annotations

import asyncio
import re

from services.api.deps import Caller, Wiring
from services.api.errors import ApiError
from services.api.routes.template_access import builds_of, shown
from services.api.template_builds import TemplateBuilds, find
from services.api.template_schemas import StepIn, TemplateBuildStart
from shared.models.template_records import (
    DEFAULT_TAG,
    BuildSpec,
    Step,
    TemplateRecord,
    blob_path,
    is_name,
)

# The images the local runtime builds on: its packaged Debian base stands for these.
_DEBIAN_IMAGES = re.compile(
    r"^(docker\.io/)?(library/)?(debian|python|node)(:[A-Za-z0-9_.-]{1,64})?$"
    r"|^e2bdev/base(:[A-Za-z0-9_.-]{1,64})?$"
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_USER = re.compile(r"^(root|user)(:(root|user))?$")
_MODE = re.compile(r"^0?[0-7]{3,4}$")


async def build_spec(
    w: Wiring, caller: Caller, template: TemplateRecord, body: TemplateBuildStart
) -> BuildSpec:
    b = builds_of(w)
    base_build: str | None = None
    if body.from_template is not None:
        if body.from_image is not None:
            raise ApiError(400, "fromImage: give fromImage or fromTemplate, not both")
        found = await find(b, body.from_template, user=caller.name, admin=caller.user.admin)
        base_build = None
        if found is not None:
            base_build = found[0].tags.get(found[1] or DEFAULT_TAG)
        elif _packaged(w, body.from_template):
            # E2B's ``base`` or an operator's template: on the local runtime the Debian rootfs
            return _spec_of(body, None, _steps(body, b, template.owner))
        if base_build is None:
            raise ApiError(
                400, f"fromTemplate: template {shown(body.from_template)} has no ready build"
            )
    elif body.from_image is not None:
        if not _DEBIAN_IMAGES.match(body.from_image):
            raise ApiError(
                400,
                f"fromImage: {shown(body.from_image)} is not available on this runtime: "
                "it builds on its packaged Debian base (debian:*, python:*, node:*, e2bdev/base)",
            )
    else:
        raise ApiError(400, "fromImage: give fromImage or fromTemplate")
    steps = _steps(body, b, template.owner)
    for i, step in enumerate(steps):
        if step.files_hash is not None and not await asyncio.to_thread(
            blob_path(b.blobs, template.owner, step.files_hash).is_file
        ):
            raise ApiError(400, f"steps[{i}].filesHash: the files were not uploaded")
    return _spec_of(body, base_build, steps)


def _packaged(w: Wiring, name: str) -> bool:
    resolved = w.settings.resolve_template(name)
    return is_name(name) and w.templates is not None and w.templates.exists(resolved)


def _steps(body: TemplateBuildStart, b: TemplateBuilds, owner: str) -> list[Step]:
    return [_step(i, step, b, owner) for i, step in enumerate(body.steps)]


def _spec_of(body: TemplateBuildStart, base_build: str | None, steps: list[Step]) -> BuildSpec:
    return BuildSpec(
        base="template" if base_build else "debian",
        base_image=body.from_image or (body.from_template if not base_build else None),
        base_build_id=base_build,
        steps=steps,
        force=body.force,
        start_cmd=body.start_cmd,
        ready_cmd=body.ready_cmd,
    )


def _step(i: int, step: StepIn, b: TemplateBuilds, owner: str) -> Step:
    where = f"steps[{i}]"
    args = step.args
    if step.type == "RUN":
        if not 1 <= len(args) <= 2 or not args[0].strip():
            raise ApiError(400, f"{where}.args: RUN takes a command and an optional user")
    elif step.type == "COPY":
        if len(args) < 2 or len(args) > 4 or not args[0] or not args[1]:
            raise ApiError(400, f"{where}.args: COPY takes a source, a destination, user, mode")
        if step.files_hash is None:
            raise ApiError(400, f"{where}.filesHash: required for COPY")
        user = args[2] if len(args) > 2 else ""
        mode = args[3] if len(args) > 3 else ""
        if user and not _USER.match(user):
            raise ApiError(400, f"{where}.args: user {shown(user)} is not root or user")
        if mode and not _MODE.match(mode):
            raise ApiError(400, f"{where}.args: mode {shown(mode)} is not an octal mode")
    elif step.type == "ENV":
        if not args or len(args) % 2:
            raise ApiError(400, f"{where}.args: ENV takes name, value pairs")
        for name in args[::2]:
            if not _ENV_NAME.match(name):
                raise ApiError(400, f"{where}.args: {shown(name)} is not a variable name")
    elif len(args) != 1 or not args[0]:  # WORKDIR, USER
        raise ApiError(400, f"{where}.args: {step.type} takes one value")
    elif step.type == "USER" and not _USER.match(args[0]):
        raise ApiError(400, f"{where}.args: user {shown(args[0])} is not root or user")
    if step.type != "COPY" and step.files_hash is not None:
        raise ApiError(400, f"{where}.filesHash: only COPY steps have files")
    return Step(
        type=step.type,
        args=list(args),
        files_hash=step.files_hash,
        force=step.force,
        force_upload=step.force_upload,
    )
