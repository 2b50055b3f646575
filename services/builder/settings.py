"""The builder's own settings (``TORPOR_BUILDER_*``). Bus, runtime, logging and health are the
shared sections (``shared.settings``)."""

from __future__ import annotations

from pydantic import Field

from shared.settings import SettingsBase, prefixed


class BuilderSettings(SettingsBase):
    model_config = prefixed("builder")

    max_workers: int = Field(default=2, ge=1, le=32)
    """Builds one builder process runs at once (the rest wait in the durable)."""
    step_timeout: float = Field(default=1800.0, gt=0)
    """Seconds one RUN step may take; then the build fails with that step."""
    pod_ready_timeout: float = Field(default=120.0, gt=0)
    """Seconds for a build pod to become ready."""
    allow_internet: bool = True
    """Whether build pods may reach the internet (package downloads). `false`: only what the
    build context brings (tests run offline builds this way)."""
    memory: str = "2Gi"
    """Memory limit of a build pod."""
    cpu: str = "1"
    """CPU limit of a build pod."""
    disk: str = "4Gi"
    """Disk of a build pod (the files one RUN step may write)."""
