"""The ledger's own settings (``TORPOR_LEDGER_*``): the sizes time is weighed by."""

from __future__ import annotations

from pydantic import Field

from shared.settings import SettingsBase, prefixed


class LedgerSettings(SettingsBase):
    model_config = prefixed("ledger")

    cpu_count: float = Field(default=2, gt=0, le=1024)
    """Cores of a sandbox whose template sets no cpu limit (the API reports the same default)."""
    memory_mb: int = Field(default=512, ge=1)
    """Memory of a sandbox whose template sets no memory limit."""
    kept_mb: int = Field(default=1024, ge=0)
    """What a paused sandbox keeps, when its template sets no disk size."""
