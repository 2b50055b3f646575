"""Settings of ``torpor up`` (flags override them)."""

from __future__ import annotations

from pydantic import Field

from shared.settings import SettingsBase, constant


class UpSettings(SettingsBase):
    api_port: int = Field(default=3000, ge=1, le=65535)
    """API port (`--api-port`), `E2B_API_URL`."""
    proxy_port: int = Field(default=3001, ge=1, le=65535)
    """Listen port; `/health`, `/livez`, `/readyz` and `/metrics` are on it."""
    nats_port: int = Field(default=4222, ge=0, le=65535)  # 0 = pick a free port
    """Embedded NATS port (`--nats-port`; 0 = any free port)."""
    stop_grace: float = constant(10.0, ge=0)
    """Seconds between SIGTERM and SIGKILL on shutdown."""
