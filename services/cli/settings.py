"""Settings of ``torpor up`` (flags override them)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class UpSettings(BaseSettings):
    model_config = SettingsConfigDict(frozen=True, extra="ignore", env_prefix="TORPOR_")

    api_port: int = Field(default=3000, ge=1, le=65535)
    proxy_port: int = Field(default=3001, ge=1, le=65535)
    nats_port: int = Field(default=4222, ge=0, le=65535)  # 0 = pick a free port
    # Seconds a service gets between SIGTERM and SIGKILL on shutdown.
    stop_grace: float = Field(default=10.0, ge=0)
