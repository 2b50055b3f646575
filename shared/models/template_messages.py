"""The builder's command: ``sandbox.cmd.template_build.<build id>`` (published by the API when a
build's steps arrive). The record in ``torpor_templates`` holds everything else."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class BuildTemplate(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    build_id: str
    template_id: str
